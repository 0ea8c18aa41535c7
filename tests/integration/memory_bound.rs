//! The in-memory idempotency store is bounded by the bytes of the answers it keeps, not only by
//! their number: large answers evict the oldest finished ones.

use std::sync::Arc;

use axum::http::StatusCode;
use carmy::idempotency::MemoryStore;
use carmy_tests::{execute, run_id};
use serde_json::json;

use crate::tools::{self, Probe};

#[tokio::test]
async fn large_answers_stay_within_the_memory_stores_byte_budget() {
    const BUDGET: usize = 1024 * 1024;
    let store = Arc::new(MemoryStore::with_limits(100_000, BUDGET));
    let router = tools::app(&Probe::default())
        .idempotency_store(Arc::clone(&store))
        .router()
        .unwrap();
    let text = "x".repeat(100 * 1024);
    let call = |index: usize| {
        json!({
            "tool": "echo",
            "arguments": { "text": text },
            "request_id": format!("{}-bytes-{index}", run_id()),
        })
    };
    let calls = 40;
    for index in 0..calls {
        let answer = execute(&router, &call(index)).await;
        assert_eq!(answer.status, StatusCode::OK, "{index}");
        assert!(
            store.bytes() <= store.max_bytes(),
            "after {} calls of 100 KiB: {} bytes kept, the budget is {}",
            index + 1,
            store.bytes(),
            store.max_bytes()
        );
    }
    assert_eq!(store.max_bytes(), BUDGET);
    assert!(
        store.bytes() > BUDGET / 2,
        "answers are kept: {}",
        store.bytes()
    );

    // The newest answer is still there; the oldest made room.
    let newest = execute(&router, &call(calls - 1)).await;
    assert_eq!(newest.header("carmy-replayed"), Some("true"));
    let oldest = execute(&router, &call(0)).await;
    assert_eq!(oldest.status, StatusCode::OK);
    assert_eq!(
        oldest.header("carmy-replayed"),
        None,
        "evicted, so it ran again"
    );
}
