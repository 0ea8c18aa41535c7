//! A shared store that cannot be reached: at start-up it is an error; later, every call with a
//! `request_id` answers a retryable `503 IDEMPOTENCY_UNAVAILABLE` and the tool does not run
//! (never a silent fallback that could run a write twice). A store that stalls (answers
//! nothing, connections open) is the same within its command timeout, and a claim it applies
//! once it resumes is undone: the tool never runs for a call that was refused.

use std::time::{Duration, Instant};

use axum::http::StatusCode;
use carmy::TrustLevel;
use carmy::protection::{RateLimit, RedisRateLimiter};
use carmy::store::StoreOptions;
use carmy_tests::{Answer, Proxy, execute, run_id, server_url, split_authority};
use serde_json::json;

use crate::tools::{self, Probe};

/// The time limits of the stalled stores; a call must be answered well within twice that.
const TIMEOUT: Duration = Duration::from_millis(500);

fn quick() -> StoreOptions {
    StoreOptions::new()
        .acquire_timeout(TIMEOUT)
        .command_timeout(TIMEOUT)
}

/// Sends `call` while the store is stalled: answered, quickly, with a retryable 503 `code`.
async fn refused_in_time(router: &axum::Router, call: &serde_json::Value, code: &str) -> Answer {
    let started = Instant::now();
    let refused = tokio::time::timeout(Duration::from_secs(10), execute(router, call))
        .await
        .expect("a call is answered while the store is stalled");
    let waited = started.elapsed();
    assert!(waited < 3 * TIMEOUT, "answered after {waited:?}");
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        refused.body
    );
    assert_eq!(refused.json()["error"]["code"], code);
    assert_eq!(refused.json()["error"]["retryable"], true);
    assert!(refused.header("retry-after").is_some());
    refused
}

async fn an_outage_after_start_up_is_503(url: &str) {
    let (target, with_authority) = split_authority(url);
    let proxy = Proxy::start(target).await;
    let store = carmy::store::connect(&with_authority(proxy.addr))
        .await
        .expect("the store is reachable at start-up");
    let probe = Probe::default();
    let router = tools::app(&probe).store(store).router().unwrap();
    let call = |request_id: &str| json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": format!("{}-{request_id}", run_id()) });
    assert_eq!(
        execute(&router, &call("before")).await.status,
        StatusCode::OK
    );

    proxy.close().await;
    for request_id in ["before", "during"] {
        let refused = execute(&router, &call(request_id)).await;
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{request_id}"
        );
        assert_eq!(refused.json()["error"]["code"], "IDEMPOTENCY_UNAVAILABLE");
        assert_eq!(refused.json()["error"]["retryable"], true);
        assert!(refused.header("retry-after").is_some());
    }
    assert_eq!(probe.runs(), 1, "no call ran without a record");
}

#[tokio::test]
async fn postgres_going_away_answers_503_idempotency_unavailable() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    an_outage_after_start_up_is_503(&url).await;
}

#[tokio::test]
async fn redis_going_away_answers_503_idempotency_unavailable() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    an_outage_after_start_up_is_503(&url).await;
}

async fn a_stall_is_503_in_time_and_the_call_never_runs(url: &str) {
    let (target, with_authority) = split_authority(url);
    let proxy = Proxy::start(target).await;
    let store = carmy::store::connect_with(&with_authority(proxy.addr), quick())
        .await
        .expect("the store is reachable at start-up");
    let probe = Probe::default();
    let router = tools::app(&probe).store(store).router().unwrap();
    let call = |request_id: &str| json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": format!("{}-stall-{request_id}", run_id()) });
    assert_eq!(
        execute(&router, &call("before")).await.status,
        StatusCode::OK
    );

    proxy.pause();
    refused_in_time(&router, &call("stalled"), "IDEMPOTENCY_UNAVAILABLE").await;
    proxy.resume();
    // The store now applies the claim it held; it is undone, and nothing runs.
    tokio::time::sleep(4 * TIMEOUT).await;
    assert_eq!(
        probe.runs(),
        1,
        "the refused call ran once the store came back"
    );

    // A retry runs it, once.
    let retried = execute(&router, &call("stalled")).await;
    assert_eq!(retried.status, StatusCode::OK, "{:?}", retried.body);
    assert_eq!(probe.runs(), 2);
}

#[tokio::test]
async fn a_stalled_postgres_is_503_in_time_and_the_call_never_runs() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    a_stall_is_503_in_time_and_the_call_never_runs(&url).await;
}

/// A retry whose record another transaction holds locked (a replica's slow commit, an
/// operator's `SELECT … FOR UPDATE`) is answered from the record without waiting for the lock:
/// retries of one key never queue behind one another's commits.
#[tokio::test]
async fn a_retry_does_not_wait_for_a_lock_on_its_postgres_record() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let store = carmy::store::connect_with(&url, quick())
        .await
        .expect("the store is reachable");
    let probe = Probe::default();
    let router = tools::app(&probe).store(store).router().unwrap();
    let request_id = format!("{}-locked", run_id());
    let call = json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": request_id });
    assert_eq!(execute(&router, &call).await.status, StatusCode::OK);

    let mut client = carmy_tests::postgres::client(&url).await;
    let holder = client.transaction().await.unwrap();
    let locked = holder
        .execute(
            "SELECT 1 FROM carmy_idempotency_records WHERE request_id = $1 FOR UPDATE",
            &[&request_id],
        )
        .await
        .unwrap();
    assert_eq!(locked, 1);
    let replayed = tokio::time::timeout(Duration::from_secs(10), execute(&router, &call))
        .await
        .expect("the retry is answered");
    assert_eq!(replayed.status, StatusCode::OK, "{:?}", replayed.body);
    assert_eq!(replayed.header("carmy-replayed"), Some("true"));
    assert_eq!(probe.runs(), 1);
    holder.rollback().await.unwrap();
}

#[tokio::test]
async fn a_stalled_redis_is_503_in_time_and_the_call_never_runs() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    a_stall_is_503_in_time_and_the_call_never_runs(&url).await;
}

/// Every request about executions while the store stalls: a retryable JSON `503` in time; the
/// execution is intact once the store answers again.
async fn a_stall_is_503_in_time_for_every_execution_request(url: &str) {
    use crate::executions::{ALICE, ASYNC, chatter, start, wait_ended};
    use carmy_tests::request;
    let (target, with_authority) = split_authority(url);
    let proxy = Proxy::start(target).await;
    let store = carmy::store::connect_with(&with_authority(proxy.addr), quick())
        .await
        .expect("the store is reachable at start-up");
    let router = crate::executions::app(&Probe::default())
        .store(store)
        .router()
        .unwrap();
    let accepted = start(&router, &chatter(1, 50), &[ALICE, ASYNC]).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    let location = accepted.header("location").unwrap().to_owned();
    let ended = wait_ended(&router, &location, ALICE).await;

    proxy.pause();
    let events = format!("{location}/events");
    for (method, path) in [
        ("GET", location.as_str()),
        ("GET", "/agent/executions"),
        ("GET", events.as_str()),
        ("DELETE", location.as_str()),
    ] {
        let started = Instant::now();
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            carmy_tests::send(&router, request(method, path, &[ALICE])),
        )
        .await
        .expect("answered while the store is stalled");
        assert!(started.elapsed() < 3 * TIMEOUT, "{method} {path}");
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{method} {path}: {:?}",
            refused.body
        );
        assert_eq!(refused.json()["error"]["code"], "IDEMPOTENCY_UNAVAILABLE");
        assert_eq!(refused.json()["error"]["retryable"], true);
    }
    let started = Instant::now();
    let refused = start(&router, &chatter(1, 0), &[ALICE, ASYNC]).await;
    assert!(started.elapsed() < 3 * TIMEOUT);
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.json()["error"]["code"], "IDEMPOTENCY_UNAVAILABLE");

    proxy.resume();
    let again = wait_ended(&router, &location, ALICE).await;
    assert_eq!(again.body, ended.body, "the finished execution is intact");
}

#[tokio::test]
async fn a_stalled_postgres_is_503_in_time_for_every_execution_request() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    a_stall_is_503_in_time_for_every_execution_request(&url).await;
}

#[tokio::test]
async fn a_stalled_redis_is_503_in_time_for_every_execution_request() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    a_stall_is_503_in_time_for_every_execution_request(&url).await;
}

#[tokio::test]
async fn time_limits_can_be_set_in_the_store_url() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    let (target, with_authority) = split_authority(&url);
    let proxy = Proxy::start(target).await;
    let store = carmy::store::connect(&format!(
        "{}?command_timeout=500ms&acquire_timeout=500ms",
        with_authority(proxy.addr)
    ))
    .await
    .expect("the store is reachable at start-up");
    let router = tools::app(&Probe::default()).store(store).router().unwrap();
    proxy.pause();
    let call = json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": format!("{}-url", run_id()) });
    refused_in_time(&router, &call, "IDEMPOTENCY_UNAVAILABLE").await;
}

#[tokio::test]
async fn a_stalled_redis_rate_limiter_is_503_in_time() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    let (target, with_authority) = split_authority(&url);
    let proxy = Proxy::start(target).await;
    let limiter = RedisRateLimiter::connect_with(&with_authority(proxy.addr), quick())
        .await
        .expect("the limiter is reachable at start-up");
    let probe = Probe::default();
    let router = tools::app(&probe)
        .rate_limit(
            TrustLevel::Anonymous,
            RateLimit {
                requests: 1_000,
                window: Duration::from_secs(60),
            },
        )
        .rate_limiter(limiter)
        .router()
        .unwrap();
    let call = json!({ "tool": "count", "arguments": { "text": "a" } });
    assert_eq!(execute(&router, &call).await.status, StatusCode::OK);
    proxy.pause();
    refused_in_time(&router, &call, "RATE_LIMITER_UNAVAILABLE").await;
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn an_unreachable_store_is_a_start_up_error() {
    // Nothing listens on a port we bound and let go.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    for url in [
        format!("postgres://postgres@{closed}/test"),
        format!("redis://{closed}"),
    ] {
        let error = carmy::store::connect(&url)
            .await
            .err()
            .unwrap_or_else(|| panic!("{url} connected"));
        assert!(!error.to_string().is_empty());
    }
}

#[tokio::test]
async fn bad_store_urls_are_clear_errors() {
    for (url, expected) in [
        (
            "mysql://127.0.0.1/db",
            "unknown idempotency store scheme `mysql`",
        ),
        ("file:", "needs a path"),
        (
            "127.0.0.1:6379",
            "unknown idempotency store scheme `127.0.0.1`",
        ),
    ] {
        let error = carmy::store::connect(url).await.err().expect(url);
        assert!(error.to_string().contains(expected), "{url}: {error}");
    }
}
