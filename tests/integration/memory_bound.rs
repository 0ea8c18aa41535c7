//! The in-memory idempotency store is bounded by the bytes of the answers it keeps, not only by
//! their number: large answers evict the oldest finished ones, and a caller's flood evicts its
//! own records, not another caller's.

use std::sync::Arc;

use axum::http::StatusCode;
use carmy::store::MemoryStore;
use carmy_tests::{execute, request, run_id, send};
use serde_json::json;

use crate::executions::{self, ALICE, BOB};
use crate::tools::{self, Probe};

#[tokio::test]
async fn large_answers_stay_within_the_memory_stores_byte_budget() {
    const BUDGET: usize = 1024 * 1024;
    let store = Arc::new(MemoryStore::with_limits(100_000, BUDGET));
    let router = tools::app(&Probe::default())
        .store(Arc::clone(&store))
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

/// One caller's flood of fresh `request_id`s fills the store; another caller's record and kept
/// execution, within its fair share, stay: its retry is replayed (the order is not placed a
/// second time) and its execution is still read back.
#[tokio::test]
async fn a_flood_by_one_caller_evicts_none_of_another_callers_records() {
    // One shard of 256 records and 128 KiB: a few thousand calls fill it many times over.
    const BUDGET: usize = 128 * 1024;
    let store = Arc::new(MemoryStore::with_limits(256, BUDGET));
    let probe = Probe::default();
    let router = executions::app(&probe)
        .store(Arc::clone(&store))
        .router()
        .unwrap();
    let order = json!({
        "tool": "count",
        "arguments": { "text": "keyboard" },
        "request_id": format!("{}-order", run_id()),
    });
    let placed = executions::start(&router, &order, &[ALICE]).await;
    assert_eq!(placed.status, StatusCode::OK, "{:?}", placed.json());
    let execution_id = placed.json()["execution_id"].as_str().unwrap().to_owned();
    let location = format!("/agent/executions/{execution_id}");

    for index in 0..3_000 {
        let flood = json!({
            "tool": "count",
            "arguments": { "text": "x" },
            "request_id": format!("{}-flood-{index}", run_id()),
        });
        let answer = executions::start(&router, &flood, &[BOB]).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "{index}: {:?}",
            answer.json()
        );
    }
    assert!(store.bytes() <= store.max_bytes());
    assert!(store.execution_bytes() <= BUDGET);
    assert_eq!(probe.runs(), 3_001);

    let retry = executions::start(&router, &order, &[ALICE]).await;
    assert_eq!(
        retry.header("carmy-replayed"),
        Some("true"),
        "the retry ran again: {:?}",
        retry.json()
    );
    assert_eq!(retry.body, placed.body);
    assert_eq!(probe.runs(), 3_001, "the order was placed once");
    let kept = send(&router, request("GET", &location, &[ALICE])).await;
    assert_eq!(kept.status, StatusCode::OK, "{:?}", kept.json());
    assert_eq!(kept.body, placed.body);

    // The flooding caller's own newest records are kept; its oldest made room.
    let newest = json!({
        "tool": "count",
        "arguments": { "text": "x" },
        "request_id": format!("{}-flood-2999", run_id()),
    });
    let replayed = executions::start(&router, &newest, &[BOB]).await;
    assert_eq!(replayed.header("carmy-replayed"), Some("true"));
    assert_eq!(probe.runs(), 3_001);
}
