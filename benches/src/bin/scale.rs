//! Scale: memory of 100,000 idempotency records in the in-memory store, and start-up time with
//! 1,000 registered tools. Prints a Markdown table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use bytes::Bytes;
use tower::ServiceExt;

use carmy::ExecutionStatus;
use carmy::store::{Fingerprint, Finish, IdempotencyKey, KeyStore, MemoryStore, StoredResponse};

#[allow(dead_code, clippy::all)]
mod many {
    include!(concat!(env!("OUT_DIR"), "/many_tools.rs"));
}

/// The resident set of this process, from `/proc/self/status`: what the records really cost,
/// allocator overhead included.
fn resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux /proc");
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches(" kB").trim().parse().ok())
        .expect("VmRSS line");
    kib * 1024
}

const RECORDS: usize = 100_000;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // A record as create_order leaves it: an anonymous caller, a UUID request id, the response.
    // Capacity is split among shards; room to spare keeps every one of the records.
    let store = MemoryStore::with_capacity(RECORDS + RECORDS / 8);
    let before = resident_bytes();
    let ttl = Duration::from_secs(24 * 60 * 60);
    let tool: Arc<str> = Arc::from("create_order");
    let caller: Arc<str> = Arc::from("anonymous");
    for n in 0..RECORDS {
        let key = IdempotencyKey::new(caller.clone(), format!("0190c3a2-7b1e-7c3d-9f4e-{n:012}"));
        let fingerprint = Fingerprint::new(tool.clone(), [n as u8; 32]);
        let execution_id: Arc<str> = Arc::from(format!("exec_0190c3a2-7b1e-7c3d-9f4e-{n:012}"));
        store
            .reserve(&key, &fingerprint, &execution_id, ttl, ttl)
            .await
            .expect("memory store");
        let body = format!(
            "{{\"execution_id\":\"{execution_id}\",\"status\":\"completed\",\"data\":{{\"order_id\":{n}}},\"_agent\":{{\"cacheable\":false,\"next_actions\":[]}}}}"
        );
        let response = StoredResponse::new(
            execution_id,
            ExecutionStatus::Completed,
            None,
            None,
            Bytes::from(body),
        );
        store
            .finish(&key, Finish::Response(&response), ttl)
            .await
            .expect("memory store");
    }
    let bytes = resident_bytes().saturating_sub(before);
    assert_eq!(store.len(), RECORDS);
    let mib = bytes as f64 / (1024.0 * 1024.0);

    let started = Instant::now();
    let router = carmy::app().router().expect("1,000 tools build");
    let startup = started.elapsed();
    // The documents are serialized on their first request: what it costs, once.
    let started = Instant::now();
    let catalog = router
        .oneshot(
            Request::get("/agent/tools")
                .body(Body::empty())
                .expect("a request"),
        )
        .await
        .expect("infallible");
    let first_catalog = started.elapsed();
    assert_eq!(catalog.status(), StatusCode::OK);

    println!("| measurement | value | target |");
    println!("|---|---:|---:|");
    println!("| in-memory store, {RECORDS} finished records | {mib:.1} MiB | ≤ 64 MiB |");
    println!(
        "| per record (resident memory) | {} bytes | |",
        bytes / RECORDS
    );
    println!(
        "| start-up (`app().router()`) with 1,000 registered tools | {:.1} ms | |",
        startup.as_secs_f64() * 1000.0
    );
    println!(
        "| first `GET /agent/tools` (serializes the catalog) with 1,000 tools | {:.1} ms | |",
        first_catalog.as_secs_f64() * 1000.0
    );
}
