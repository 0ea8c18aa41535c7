//! Shared-store outcome recording: an outcome the store fails to record is tried
//! again, a record ttl shorter than a deadline is refused at start-up, and a store outage is
//! not logged once per call.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use carmy::store::{
    Fingerprint, Finish, IdempotencyKey, KeyStore, MemoryStore, Reservation, StoreError,
};
use carmy_tests::{Captured, execute};
use futures_util::future::BoxFuture;
use serde_json::json;

use crate::tools::{self, Probe};

/// A memory store whose `reserve` fails always (an outage) or whose `finish` fails a number of
/// times first.
#[derive(Default)]
struct Failing {
    inner: MemoryStore,
    reserve_down: bool,
    finish_failures: AtomicUsize,
    finish_calls: AtomicUsize,
}

fn outage() -> StoreError {
    StoreError::new(std::io::Error::other("connection refused"))
}

impl KeyStore for Failing {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        if self.reserve_down {
            return Box::pin(async { Err(outage()) });
        }
        self.inner
            .reserve(key, fingerprint, execution_id, lease, ttl)
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.finish_calls.fetch_add(1, Ordering::SeqCst);
        let failing = self
            .finish_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failing {
            return Box::pin(async { Err(outage()) });
        }
        self.inner.finish(key, finish, ttl)
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.release(key, execution_id)
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        self.inner.purge_expired()
    }
}

#[tokio::test]
async fn an_outcome_the_store_fails_to_record_is_tried_again() {
    let probe = Probe::default();
    let store = Arc::new(Failing {
        finish_failures: AtomicUsize::new(2),
        ..Failing::default()
    });
    let router = tools::app(&probe)
        .key_store(Arc::clone(&store))
        .default_timeout(Duration::from_secs(2))
        .router()
        .unwrap();
    let call = json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": "rec-1" });
    let first = execute(&router, &call).await;
    assert_eq!(first.json()["status"], "completed");
    assert_eq!(store.finish_calls.load(Ordering::SeqCst), 3);

    // The retry gets the recorded answer; the tool ran once.
    let again = execute(&router, &call).await;
    assert_eq!(again.header("carmy-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn a_record_ttl_shorter_than_a_deadline_is_refused_at_start_up() {
    let probe = Probe::default();
    // `slow_write` declares a 2 s timeout.
    let error = tools::app(&probe)
        .idempotency_ttl(Duration::from_secs(2))
        .router()
        .unwrap_err();
    assert!(
        matches!(error, carmy::Error::TtlShorterThanDeadline { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("tool `"), "{error}");

    // The application default counts for tools without their own timeout.
    let error = carmy::App::new()
        .tool(tools::echo::TOOL)
        .default_timeout(Duration::from_secs(60))
        .idempotency_ttl(Duration::from_secs(30))
        .router()
        .unwrap_err();
    assert!(error.to_string().contains("tool `echo`"), "{error}");

    // A ttl that outlives every deadline is fine.
    let _router = carmy::App::new()
        .tool(tools::echo::TOOL)
        .default_timeout(Duration::from_secs(5))
        .idempotency_ttl(Duration::from_secs(10))
        .router()
        .unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_store_outage_is_not_logged_once_per_call() {
    let captured = Captured::default();
    let _default = captured.set_default(tracing::Level::TRACE);
    let store = Failing {
        reserve_down: true,
        ..Failing::default()
    };
    let router = tools::app(&Probe::default())
        .key_store(store)
        .router()
        .unwrap();
    for index in 0..2_000 {
        let call = json!({ "tool": "echo", "arguments": { "text": "a" }, "request_id": format!("out-{index}") });
        let answer = execute(&router, &call).await;
        assert_eq!(answer.json()["error"]["code"], "IDEMPOTENCY_UNAVAILABLE");
    }
    let logged = captured
        .lines()
        .iter()
        .filter(|line| line.contains("idempotency store failed"))
        .count();
    assert_eq!(logged, 1, "2,000 failing calls, {logged} lines");
}
