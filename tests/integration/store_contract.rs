//! The contract every `IdempotencyStore` keeps, written once and run against each backend,
//! plus the in-memory store's own bounds. Time is tokio's paused clock where the backend's
//! clock allows it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use carmy::idempotency::{
    ExecutionStatus, Fingerprint, Finish, IdempotencyKey, IdempotencyStore, MemoryStore,
    Reservation, StoredResponse,
};

const TTL: Duration = Duration::from_secs(60);

fn key(request_id: &str) -> IdempotencyKey {
    IdempotencyKey::new("caller", request_id)
}

fn fingerprint(tool: &str, byte: u8) -> Fingerprint {
    Fingerprint {
        tool: Arc::from(tool),
        digest: [byte; 32],
    }
}

fn response(execution_id: &str) -> StoredResponse {
    StoredResponse {
        execution_id: Arc::from(execution_id),
        status: ExecutionStatus::Completed,
        category: None,
        code: None,
        body: Bytes::from(format!("{{\"execution_id\":\"{execution_id}\"}}")),
    }
}

async fn reserve(
    store: &dyn IdempotencyStore,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
) -> Reservation {
    store
        .reserve(key, fingerprint, "exec_x", TTL)
        .await
        .expect("store works")
}

/// reserve → running → finished → replay; conflict; release; uncertain.
pub(crate) async fn lifecycle(store: &dyn IdempotencyStore) {
    let (k, fp) = (key("life"), fingerprint("create_order", 1));
    assert!(matches!(
        reserve(store, &k, &fp).await,
        Reservation::Reserved
    ));
    assert!(matches!(
        reserve(store, &k, &fp).await,
        Reservation::Running { .. }
    ));
    match reserve(store, &k, &fingerprint("create_order", 2)).await {
        Reservation::Conflict { tool } => assert_eq!(&*tool, "create_order"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    store
        .finish(&k, Finish::Response(response("exec_1")), TTL)
        .await
        .unwrap();
    match reserve(store, &k, &fp).await {
        Reservation::Finished(stored) => assert_eq!(stored, response("exec_1")),
        other => panic!("expected the recorded response, got {other:?}"),
    }
    match reserve(store, &k, &fingerprint("get_order", 1)).await {
        Reservation::Conflict { tool } => assert_eq!(&*tool, "create_order"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // Keys are per caller.
    let other_caller = IdempotencyKey::new("someone-else", "life");
    assert!(matches!(
        reserve(store, &other_caller, &fp).await,
        Reservation::Reserved
    ));

    let released = key("released");
    assert!(matches!(
        reserve(store, &released, &fp).await,
        Reservation::Reserved
    ));
    store.release(&released).await.unwrap();
    assert!(matches!(
        reserve(store, &released, &fp).await,
        Reservation::Reserved
    ));

    let uncertain = key("uncertain");
    assert!(matches!(
        reserve(store, &uncertain, &fp).await,
        Reservation::Reserved
    ));
    store
        .finish(
            &uncertain,
            Finish::Uncertain {
                execution_id: Arc::from("exec_u"),
            },
            TTL,
        )
        .await
        .unwrap();
    match reserve(store, &uncertain, &fp).await {
        Reservation::Uncertain { execution_id } => assert_eq!(&*execution_id, "exec_u"),
        other => panic!("expected uncertain, got {other:?}"),
    }
    // The host clears an uncertain record once it knows what happened.
    store.release(&uncertain).await.unwrap();
    assert!(matches!(
        reserve(store, &uncertain, &fp).await,
        Reservation::Reserved
    ));
}

/// A duplicate waiting on a running record is woken when it finishes.
pub(crate) async fn waiters_are_woken(store: Arc<dyn IdempotencyStore>) {
    let (k, fp) = (key("wait"), fingerprint("t", 1));
    assert!(matches!(
        reserve(&*store, &k, &fp).await,
        Reservation::Reserved
    ));
    let Reservation::Running { changed } = reserve(&*store, &k, &fp).await else {
        panic!("expected running");
    };
    let finisher = {
        let store = store.clone();
        let k = k.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            store
                .finish(&k, Finish::Response(response("exec_w")), TTL)
                .await
                .unwrap();
        })
    };
    changed.await;
    finisher.await.unwrap();
    assert!(matches!(
        reserve(&*store, &k, &fp).await,
        Reservation::Finished(_)
    ));
}

/// Records older than their ttl count as absent; `advance` moves the backend's clock.
pub(crate) async fn expiry<F: std::future::Future<Output = ()>>(
    store: &dyn IdempotencyStore,
    ttl: Duration,
    advance: impl Fn(Duration) -> F,
) {
    let (k, fp) = (key("expiring"), fingerprint("t", 1));
    assert!(matches!(
        store.reserve(&k, &fp, "exec_1", ttl).await.unwrap(),
        Reservation::Reserved
    ));
    store
        .finish(&k, Finish::Response(response("exec_1")), ttl)
        .await
        .unwrap();
    assert!(matches!(
        store.reserve(&k, &fp, "exec_2", ttl).await.unwrap(),
        Reservation::Finished(_)
    ));
    advance(ttl + Duration::from_millis(10)).await;
    assert!(matches!(
        store
            .reserve(&k, &fingerprint("t", 9), "exec_3", ttl)
            .await
            .unwrap(),
        Reservation::Reserved
    ));

    let purged = key("purged");
    store.reserve(&purged, &fp, "exec_4", ttl).await.unwrap();
    store
        .finish(&purged, Finish::Response(response("exec_4")), ttl)
        .await
        .unwrap();
    advance(ttl + Duration::from_millis(10)).await;
    assert!(store.purge_expired().await.unwrap() >= 1);
}

/// Concurrent reservations of one key: exactly one wins.
pub(crate) async fn one_winner(store: Arc<dyn IdempotencyStore>, contenders: usize) {
    let barrier = Arc::new(tokio::sync::Barrier::new(contenders));
    let tasks: Vec<_> = (0..contenders)
        .map(|index| {
            let store = store.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let (k, fp) = (key("contended"), fingerprint("t", 1));
                barrier.wait().await;
                let reservation = store
                    .reserve(&k, &fp, &format!("exec_{index}"), TTL)
                    .await
                    .unwrap();
                matches!(reservation, Reservation::Reserved)
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        winners += usize::from(task.await.unwrap());
    }
    assert_eq!(winners, 1);
}

#[tokio::test]
async fn memory_lifecycle() {
    lifecycle(&MemoryStore::new()).await;
}

#[tokio::test]
async fn memory_waiters_are_woken() {
    waiters_are_woken(Arc::new(MemoryStore::new())).await;
}

#[tokio::test(start_paused = true)]
async fn memory_expiry() {
    expiry(
        &MemoryStore::new(),
        Duration::from_secs(24 * 60 * 60),
        tokio::time::advance,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_one_winner_among_200() {
    one_winner(Arc::new(MemoryStore::new()), 200).await;
}

#[tokio::test(start_paused = true)]
async fn memory_store_evicts_the_oldest_finished_records_first_never_a_running_one() {
    let store = MemoryStore::with_capacity(3);
    assert_eq!(store.capacity(), 3);
    let fp = fingerprint("t", 1);
    for id in ["a", "b"] {
        assert!(matches!(
            reserve(&store, &key(id), &fp).await,
            Reservation::Reserved
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        store
            .finish(&key(id), Finish::Response(response(id)), TTL)
            .await
            .unwrap();
    }
    assert!(matches!(
        reserve(&store, &key("running"), &fp).await,
        Reservation::Reserved
    ));
    assert_eq!(store.len(), 3);

    // Full: the oldest finished record, "a", makes room for "c".
    assert!(matches!(
        reserve(&store, &key("c"), &fp).await,
        Reservation::Reserved
    ));
    assert_eq!(store.len(), 3);
    // "b" is still there; the next reservation evicts it, the last finished record…
    assert!(matches!(
        reserve(&store, &key("b"), &fp).await,
        Reservation::Finished(_)
    ));
    assert!(matches!(
        reserve(&store, &key("d"), &fp).await,
        Reservation::Reserved
    ));
    // …and then only running records remain: nothing is evicted, the store is full.
    assert!(matches!(
        reserve(&store, &key("e"), &fp).await,
        Reservation::Full
    ));
    assert!(
        matches!(reserve(&store, &key("a"), &fp).await, Reservation::Full),
        "a is gone"
    );
    for running in ["running", "c", "d"] {
        assert!(
            matches!(
                reserve(&store, &key(running), &fp).await,
                Reservation::Running { .. }
            ),
            "{running}"
        );
    }
}
