//! In-process micro-benchmarks: the execution pipeline without a transport, argument validation,
//! the idempotency store under concurrency, and building the catalog of 1,000 tools.

use std::future::IntoFuture;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use carmy::ExecutionStatus;
use carmy::store::{Fingerprint, Finish, IdempotencyKey, KeyStore, MemoryStore, StoredResponse};
use serde_json::json;

#[allow(dead_code, clippy::all)]
mod many {
    include!(concat!(env!("OUT_DIR"), "/many_tools.rs"));
}

fn main() {
    divan::main();
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// One `create_order` call through the whole pipeline (validation, execution, serialization),
/// with no transport: `carmy::testing::Client`.
#[divan::bench(args = [false, true])]
fn pipeline_create_order(bencher: divan::Bencher<'_, '_>, with_request_id: bool) {
    let runtime = runtime();
    let client = carmy::testing::Client::new(shop::app()).expect("shop builds");
    let mut n = 0u64;
    bencher.bench_local(|| {
        n += 1;
        let call = client.call("create_order", json!({ "sku": "KB-01" }));
        let call = if with_request_id {
            call.request_id(format!("r{n}"))
        } else {
            call
        };
        runtime.block_on(call.into_future())
    });
}

/// Validating `create_order`'s arguments against its compiled input schema.
#[divan::bench]
fn validate_arguments(bencher: divan::Bencher<'_, '_>) {
    let schema = (shop::create_order::TOOL.input_schema)();
    let validator = jsonschema::validator_for(&schema).expect("valid schema");
    let arguments = json!({ "sku": "KB-01", "quantity": 2 });
    bencher.bench(|| validator.is_valid(divan::black_box(&arguments)));
}

/// Reserve then finish a fresh key, from 1, 16 and 64 concurrent tasks.
#[divan::bench(args = [1, 16, 64])]
fn store_reserve_finish(bencher: divan::Bencher<'_, '_>, tasks: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let store = Arc::new(MemoryStore::new());
    let ttl = Duration::from_secs(3600);
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    bencher
        .counter(divan::counter::ItemsCount::new(tasks))
        .bench(|| {
            runtime.block_on(async {
                let handles: Vec<_> = (0..tasks)
                    .map(|_| {
                        let store = store.clone();
                        let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::spawn(async move {
                            let key = IdempotencyKey::new("bench", format!("k{n}"));
                            let fingerprint = Fingerprint::new("create_order", [1; 32]);
                            store
                                .reserve(&key, &fingerprint, &Arc::from("exec"), ttl, ttl)
                                .await
                                .expect("memory store");
                            let response = StoredResponse::new(
                                "exec",
                                ExecutionStatus::Completed,
                                None,
                                None,
                                Bytes::from_static(b"{}"),
                            );
                            store
                                .finish(&key, Finish::Response(&response), ttl)
                                .await
                                .expect("memory store");
                        })
                    })
                    .collect();
                for handle in handles {
                    handle.await.expect("task");
                }
            });
        });
}

/// Building the router (schemas, validators, serialized documents) for 1,000 tools.
#[divan::bench(sample_count = 10)]
fn build_catalog_1000_tools() -> axum::Router {
    carmy::app()
        .state(shop::Shop::new())
        .router()
        .expect("1,000 tools build")
}
