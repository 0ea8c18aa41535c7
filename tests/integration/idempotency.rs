//! Every row of the idempotency table of protocol.md §4, through the router.

use std::time::Duration;

use axum::http::StatusCode;
use carmy::Principal;
use carmy_tests::{execute, execute_request, send};
use serde_json::json;

use crate::tools::{self, Probe};

#[tokio::test]
async fn a_finished_call_is_replayed_byte_for_byte_without_running_again() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    let call = json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": "order-7f3" });
    let first = execute(&router, &call).await;
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.header("carmy-replayed").is_none());
    // Keys in another order are the same call.
    let reordered =
        json!({ "request_id": "order-7f3", "arguments": { "text": "a" }, "tool": "count" });
    for replay in [
        execute(&router, &call).await,
        execute(&router, &reordered).await,
    ] {
        assert_eq!(replay.status, StatusCode::OK);
        assert_eq!(replay.header("carmy-replayed"), Some("true"));
        assert_eq!(replay.header("cache-control"), Some("no-store"));
        assert_eq!(replay.body, first.body);
    }
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn the_idempotency_key_header_is_the_same_request_id() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    let first = send(
        &router,
        execute_request(
            &json!({ "tool": "count", "arguments": { "text": "a" } }),
            &[("idempotency-key", "k1")],
        ),
    )
    .await;
    let second = execute(
        &router,
        &json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": "k1" }),
    )
    .await;
    assert_eq!(second.header("carmy-replayed"), Some("true"));
    assert_eq!(second.body, first.body);
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn a_final_failure_is_recorded_and_replayed() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    let call = json!({ "tool": "refuse", "request_id": "r1" });
    let first = execute(&router, &call).await;
    assert_eq!(first.status, StatusCode::CONFLICT);
    let again = execute(&router, &call).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.header("carmy-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(probe.runs(), 1);
    // The recorded failure suggests no retry that would only replay it.
    let actions = first.json()["_agent"]["next_actions"].clone();
    assert!(
        actions
            .as_array()
            .unwrap()
            .iter()
            .all(|action| action["tool"] != "refuse"),
        "{actions}"
    );
}

#[tokio::test]
async fn the_same_key_for_another_call_is_409_idempotency_conflict() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    execute(
        &router,
        &json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": "r1" }),
    )
    .await;
    for other in [
        json!({ "tool": "count", "arguments": { "text": "b" }, "request_id": "r1" }),
        json!({ "tool": "echo", "arguments": { "text": "a" }, "request_id": "r1" }),
    ] {
        let answer = execute(&router, &other).await;
        assert_eq!(answer.status, StatusCode::CONFLICT);
        let body = answer.json();
        assert_eq!(body["error"]["code"], "IDEMPOTENCY_CONFLICT");
        assert_eq!(body["error"]["details"]["tool"], "count");
        assert_ne!(body["execution_id"], json!(null));
    }
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn records_are_kept_per_caller() {
    let probe = Probe::default();
    let router = tools::app(&probe)
        .router()
        .unwrap()
        .layer(axum::middleware::from_fn(
            |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                let user = request
                    .headers()
                    .get("x-user")
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                if let Some(user) = user {
                    request
                        .extensions_mut()
                        .insert(Principal::new(user, carmy::TrustLevel::Known));
                }
                next.run(request).await
            },
        ));
    let call = json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": "shared-id" });
    let alice = send(&router, execute_request(&call, &[("x-user", "alice")])).await;
    let bob = send(&router, execute_request(&call, &[("x-user", "bob")])).await;
    assert_ne!(alice.body, bob.body);
    assert!(bob.header("carmy-replayed").is_none());
    let alice_again = send(&router, execute_request(&call, &[("x-user", "alice")])).await;
    assert_eq!(alice_again.body, alice.body);
    assert_eq!(probe.runs(), 2);
}

#[tokio::test]
async fn rejected_calls_record_nothing_and_the_id_stays_free() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    for rejected in [
        json!({ "tool": "nope", "request_id": "free" }),
        json!({ "tool": "count", "arguments": { "text": 1 }, "request_id": "free" }),
        json!({ "tool": "wipe", "request_id": "free" }),
    ] {
        let answer = execute(&router, &rejected).await;
        assert!(answer.status.is_client_error(), "{rejected}");
    }
    let answer = execute(
        &router,
        &json!({ "tool": "count", "arguments": { "text": "ok" }, "request_id": "free" }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.header("carmy-replayed").is_none());
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn a_retryable_failure_keeps_nothing_so_a_retry_runs_again() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    let call = json!({ "tool": "flaky", "request_id": "again" });
    let first = execute(&router, &call).await;
    let second = execute(&router, &call).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(second.header("carmy-replayed").is_none());
    assert_ne!(first.json()["execution_id"], second.json()["execution_id"]);
    assert_eq!(probe.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_idempotent_call_keeps_nothing() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    let slow =
        json!({ "tool": "slow_read", "arguments": { "millis": 10_000 }, "request_id": "read-1" });
    let first = execute(&router, &slow).await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    let second = execute(&router, &slow).await;
    assert_eq!(second.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(second.header("carmy-replayed").is_none());
    assert_eq!(probe.runs(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_write_is_uncertain_until_the_record_expires() {
    let probe = Probe::default();
    let router = tools::app(&probe)
        .idempotency_ttl(Duration::from_secs(60))
        .router()
        .unwrap();
    let slow =
        json!({ "tool": "slow_write", "arguments": { "millis": 10_000 }, "request_id": "pay-1" });
    let first = execute(&router, &slow).await;
    assert_eq!(first.status, StatusCode::GATEWAY_TIMEOUT);
    let first = first.json();
    assert_eq!(first["status"], "timed_out");
    assert_eq!(
        first["error"]["retryable"], false,
        "a retry could pay twice"
    );
    assert_eq!(first["_agent"]["next_actions"], json!([]));

    let retry = execute(&router, &slow).await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    let body = retry.json();
    assert_eq!(body["error"]["code"], "EXECUTION_UNCERTAIN");
    assert_eq!(
        body["error"]["details"]["execution_id"],
        first["execution_id"]
    );
    assert_eq!(body["_agent"]["next_actions"], json!([]));
    assert_eq!(probe.runs(), 1, "never a second execution");

    tokio::time::advance(Duration::from_secs(61)).await;
    let after_expiry = execute(
        &router,
        &json!({ "tool": "slow_write", "arguments": { "millis": 0 }, "request_id": "pay-1" }),
    )
    .await;
    assert_eq!(after_expiry.status, StatusCode::OK);
    assert_eq!(probe.runs(), 2);
}

#[tokio::test]
async fn a_running_duplicate_waits_and_gets_the_same_answer() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    let call = json!({ "tool": "slow_write", "arguments": { "millis": 300 }, "request_id": "dup" });
    let first = tokio::spawn({
        let router = router.clone();
        let call = call.clone();
        async move { execute(&router, &call).await }
    });
    probe.wait_runs(1).await;
    let duplicate = execute(&router, &call).await;
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(duplicate.status, StatusCode::OK);
    assert_eq!(duplicate.body, first.body);
    assert_eq!(duplicate.header("carmy-replayed"), Some("true"));
    assert_eq!(probe.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_duplicates_run_once_and_all_get_the_answer() {
    let probe = Probe::default();
    let router = tools::app(&probe).router().unwrap();
    let call =
        json!({ "tool": "slow_write", "arguments": { "millis": 100 }, "request_id": "stampede" });
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let calls: Vec<_> = (0..64)
        .map(|_| {
            let router = router.clone();
            let call = call.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                execute(&router, &call).await
            })
        })
        .collect();
    let mut bodies = Vec::new();
    let mut replayed = 0;
    for call in calls {
        let answer = call.await.unwrap();
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        replayed += usize::from(answer.header("carmy-replayed").is_some());
        bodies.push(answer.body);
    }
    assert_eq!(probe.runs(), 1, "exactly one execution");
    assert!(
        bodies.iter().all(|body| *body == bodies[0]),
        "every caller gets the same answer"
    );
    assert_eq!(replayed, 63);
}

#[tokio::test]
async fn a_full_store_of_running_calls_is_503_idempotency_capacity() {
    let probe = Probe::default();
    let router = tools::app(&probe)
        .store(carmy::store::MemoryStore::with_capacity(1))
        .router()
        .unwrap();
    let slow = tokio::spawn({
        let router = router.clone();
        async move {
            execute(&router, &json!({ "tool": "slow_write", "arguments": { "millis": 300 }, "request_id": "held" })).await
        }
    });
    probe.wait_runs(1).await;
    let refused = execute(
        &router,
        &json!({ "tool": "count", "arguments": { "text": "x" }, "request_id": "other" }),
    )
    .await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.json()["error"]["code"], "IDEMPOTENCY_CAPACITY");
    assert_eq!(refused.json()["error"]["retryable"], true);
    assert!(refused.header("retry-after").is_some());
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
    // Once the first finished, it is the oldest finished record and makes room.
    let accepted = execute(
        &router,
        &json!({ "tool": "count", "arguments": { "text": "x" }, "request_id": "other" }),
    )
    .await;
    assert_eq!(accepted.status, StatusCode::OK);
    // … and calls without a request_id never touch the store.
    let plain = execute(
        &router,
        &json!({ "tool": "count", "arguments": { "text": "y" } }),
    )
    .await;
    assert_eq!(plain.status, StatusCode::OK);
}
