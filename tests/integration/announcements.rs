//! Shared stores announce every change of an execution (PostgreSQL LISTEN/NOTIFY, Redis
//! pub/sub): another replica waiting on it wakes at once, not at its next read. The readers
//! here re-read only once an hour, so a wake-up within seconds is the announcement; after the
//! listening connection is cut, the store listens again and announcements resume.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use carmy::ExecutionStatus;
use carmy::store::{
    Cancellation, ExecutionStore, RecordedEvent, RecordedOutcome, StoreOptions, StoredResponse,
};
use carmy_tests::{Proxy, run_id, server_url, split_authority};

/// Longer than any test: a reader that wakes did not wake by re-reading.
const NEVER: Duration = Duration::from_secs(3600);
/// Far more than an announcement takes, far less than [`NEVER`].
const ANNOUNCED_WITHIN: Duration = Duration::from_secs(10);

/// Resolves once `reader` is hearing announcements again: its wait for an execution nobody
/// changes no longer ends at the next poll (200 ms) while it is not listening.
async fn until_listening(reader: &dyn ExecutionStore, execution_id: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::timeout(
        Duration::from_millis(600),
        reader.execution_changed(execution_id),
    )
    .await
    .is_ok()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store never listened again"
        );
    }
}

async fn announced(reader: &dyn ExecutionStore, execution_id: &str, change: impl Future) {
    let woken = reader.execution_changed(execution_id);
    change.await;
    tokio::time::timeout(ANNOUNCED_WITHIN, woken)
        .await
        .expect("the change is announced to the other replica");
}

/// `writer` and `reader` share one engine; `reader` goes through `proxy`.
async fn changes_reach_the_other_replica(
    writer: Arc<dyn ExecutionStore>,
    reader: Arc<dyn ExecutionStore>,
    proxy: &Proxy,
    name: &str,
) {
    let caller = format!("alice-{}", run_id());
    let execution_id: Arc<str> = Arc::from(format!("exec_announced-{name}-{}", run_id()));
    writer
        .begin_execution(&caller, &execution_id, "report", NEVER)
        .await
        .unwrap();
    until_listening(&*reader, &execution_id).await;

    let progress = |id: u64| RecordedEvent::new(id, Bytes::from(format!("{{\"progress\":{id}}}")));
    announced(
        &*reader,
        &execution_id,
        writer.record_progress(&execution_id, progress(2)),
    )
    .await;

    // And the other way: a cancellation requested on the reader's side.
    announced(&*writer, &execution_id, async {
        assert_eq!(
            reader
                .cancel_execution(&caller, &execution_id)
                .await
                .unwrap(),
            Cancellation::Requested
        );
    })
    .await;
    // The listening connection drops (a restarted server): the store listens again, and
    // what is announced then wakes the reader as before.
    proxy.cut();
    until_listening(&*reader, &execution_id).await;
    announced(
        &*reader,
        &execution_id,
        writer.record_progress(&execution_id, progress(3)),
    )
    .await;
    let response = StoredResponse::new(
        Arc::clone(&execution_id),
        ExecutionStatus::Completed,
        None,
        None,
        Bytes::from_static(b"{}"),
    );
    announced(
        &*reader,
        &execution_id,
        writer.end_execution(&execution_id, RecordedOutcome::new(response, 4), NEVER),
    )
    .await;
}

async fn over_a_proxy(url: &str, name: &str) {
    let (target, with_authority) = split_authority(url);
    let proxy = Proxy::start(target).await;
    let options = StoreOptions::new().execution_recheck(NEVER);
    let writer = carmy::store::connect_with(url, options.clone())
        .await
        .unwrap();
    let reader = carmy::store::connect_with(&with_authority(proxy.addr), options)
        .await
        .unwrap();
    changes_reach_the_other_replica(writer, reader, &proxy, name).await;
    proxy.close().await;
}

#[tokio::test]
async fn postgres_announces_changes_to_other_replicas_and_listens_again_after_a_cut() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    over_a_proxy(&url, "postgres").await;
}

#[tokio::test]
async fn redis_announces_changes_to_other_replicas_and_listens_again_after_a_cut() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    over_a_proxy(&url, "redis").await;
}
