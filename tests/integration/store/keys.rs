//! The contract of every `KeyStore` (idempotency records), written once against the trait and
//! run against each engine.

use std::sync::Arc;
use std::time::Duration;

use carmy::ExecutionStatus;
use carmy::store::{Fingerprint, Finish, IdempotencyKey, KeyStore, MemoryStore, Reservation};
use carmy_tests::run_id;

use super::{
    LEASE, TTL, TempFile, file_store, fingerprint, key, postgres_store, redis_store, response,
    sleep,
};

pub(super) async fn reserve(
    store: &dyn KeyStore,
    key: &IdempotencyKey,
    fingerprint: &Fingerprint,
    execution_id: &str,
) -> Reservation {
    store
        .reserve(key, fingerprint, &Arc::from(execution_id), LEASE, TTL)
        .await
        .expect("store works")
}

/// reserve → running → finished → replay; conflict; release; uncertain; only the execution
/// that reserved a key finishes it.
pub(crate) async fn lifecycle(store: &dyn KeyStore) {
    let (k, fp) = (key("life"), fingerprint("create_order", 1));
    assert!(matches!(
        reserve(store, &k, &fp, "exec_1").await,
        Reservation::Reserved
    ));
    assert!(matches!(
        reserve(store, &k, &fp, "exec_2").await,
        Reservation::Running { .. }
    ));
    match reserve(store, &k, &fingerprint("create_order", 2), "exec_3").await {
        Reservation::Conflict { tool } => assert_eq!(&*tool, "create_order"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // A finish from an execution that does not hold the key changes nothing.
    store
        .finish(&k, Finish::Response(&response("exec_2")), TTL)
        .await
        .unwrap();
    assert!(matches!(
        reserve(store, &k, &fp, "exec_4").await,
        Reservation::Running { .. }
    ));
    store
        .finish(&k, Finish::Response(&response("exec_1")), TTL)
        .await
        .unwrap();
    match reserve(store, &k, &fp, "exec_5").await {
        Reservation::Finished(stored) => assert_eq!(stored, response("exec_1")),
        other => panic!("expected the recorded response, got {other:?}"),
    }
    match reserve(store, &k, &fingerprint("get_order", 1), "exec_6").await {
        Reservation::Conflict { tool } => assert_eq!(&*tool, "create_order"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // Keys are per caller.
    let other_caller = IdempotencyKey::new(format!("someone-else-{}", run_id()), "life");
    assert!(matches!(
        reserve(store, &other_caller, &fp, "exec_7").await,
        Reservation::Reserved
    ));

    let released = key("released");
    assert!(matches!(
        reserve(store, &released, &fp, "exec_8").await,
        Reservation::Reserved
    ));
    store.release(&released, "exec_8").await.unwrap();
    assert!(matches!(
        reserve(store, &released, &fp, "exec_9").await,
        Reservation::Reserved
    ));

    // A failure is kept with its category and code.
    let failed = key("failed");
    assert!(matches!(
        reserve(store, &failed, &fp, "exec_f").await,
        Reservation::Reserved
    ));
    let mut failure = response("exec_f");
    failure.status = ExecutionStatus::Failed;
    failure.category = Some(carmy::Category::Conflict);
    failure.code = Some(Arc::from("OUT_OF_STOCK"));
    store
        .finish(&failed, Finish::Response(&failure), TTL)
        .await
        .unwrap();
    match reserve(store, &failed, &fp, "exec_g").await {
        Reservation::Finished(stored) => assert_eq!(stored, failure),
        other => panic!("expected the recorded failure, got {other:?}"),
    }

    let uncertain = key("uncertain");
    assert!(matches!(
        reserve(store, &uncertain, &fp, "exec_u").await,
        Reservation::Reserved
    ));
    store
        .finish(
            &uncertain,
            Finish::Uncertain {
                execution_id: &Arc::from("exec_u"),
            },
            TTL,
        )
        .await
        .unwrap();
    match reserve(store, &uncertain, &fp, "exec_v").await {
        Reservation::Uncertain { execution_id } => assert_eq!(&*execution_id, "exec_u"),
        other => panic!("expected uncertain, got {other:?}"),
    }
    // The host clears an uncertain record once it knows what happened.
    store.release(&uncertain, "exec_u").await.unwrap();
    assert!(matches!(
        reserve(store, &uncertain, &fp, "exec_w").await,
        Reservation::Reserved
    ));
}

/// A duplicate waiting on a running record is woken when it finishes.
pub(crate) async fn waiters_are_woken(store: Arc<dyn KeyStore>) {
    let (k, fp) = (key("wait"), fingerprint("t", 1));
    assert!(matches!(
        reserve(&*store, &k, &fp, "exec_w").await,
        Reservation::Reserved
    ));
    let Reservation::Running { mut changed, .. } = reserve(&*store, &k, &fp, "exec_2").await else {
        panic!("expected running");
    };
    // Nothing has changed yet: a waiter woken now would only ask again, and again.
    assert!(
        futures_util::FutureExt::now_or_never(&mut changed).is_none(),
        "a waiter is woken before the record changes"
    );
    let finisher = {
        let store = store.clone();
        let k = k.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            store
                .finish(&k, Finish::Response(&response("exec_w")), TTL)
                .await
                .unwrap();
        })
    };
    changed.await;
    finisher.await.unwrap();
    assert!(matches!(
        reserve(&*store, &k, &fp, "exec_3").await,
        Reservation::Finished(_)
    ));
}

/// What `purge_expired` finds once records have expired.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Purge {
    /// The store deletes them and counts them.
    Counted,
    /// The engine dropped them already (Redis): nothing is left to purge.
    ByEngine,
}

/// Records older than their ttl count as absent; `advance` moves the backend's clock.
pub(crate) async fn expiry<F: std::future::Future<Output = ()>>(
    store: &dyn KeyStore,
    ttl: Duration,
    advance: impl Fn(Duration) -> F,
    purge: Purge,
) {
    let (k, fp) = (key("expiring"), fingerprint("t", 1));
    assert!(matches!(
        store
            .reserve(&k, &fp, &Arc::from("exec_1"), LEASE, ttl)
            .await
            .unwrap(),
        Reservation::Reserved
    ));
    store
        .finish(&k, Finish::Response(&response("exec_1")), ttl)
        .await
        .unwrap();
    assert!(matches!(
        store
            .reserve(&k, &fp, &Arc::from("exec_2"), LEASE, ttl)
            .await
            .unwrap(),
        Reservation::Finished(_)
    ));
    advance(ttl + Duration::from_millis(10)).await;
    assert!(matches!(
        store
            .reserve(&k, &fingerprint("t", 9), &Arc::from("exec_3"), LEASE, ttl)
            .await
            .unwrap(),
        Reservation::Reserved
    ));

    let purged = key("purged");
    store
        .reserve(&purged, &fp, &Arc::from("exec_4"), LEASE, ttl)
        .await
        .unwrap();
    store
        .finish(&purged, Finish::Response(&response("exec_4")), ttl)
        .await
        .unwrap();
    advance(ttl + Duration::from_millis(10)).await;
    let count = store.purge_expired().await.unwrap();
    match purge {
        Purge::Counted => assert!(count >= 1, "purged {count}"),
        Purge::ByEngine => assert_eq!(count, 0),
    }
}

/// A running record whose lease has passed (its replica died) turns uncertain, carrying the
/// first execution's id: a retry never runs a second time and never waits forever. If that
/// execution does finish after all, its outcome replaces the uncertainty.
pub(crate) async fn lease_expiry<F: std::future::Future<Output = ()>>(
    store: &dyn KeyStore,
    lease: Duration,
    advance: impl Fn(Duration) -> F,
) {
    let (k, fp) = (key("leased"), fingerprint("t", 1));
    assert!(matches!(
        store
            .reserve(&k, &fp, &Arc::from("exec_dead"), lease, TTL)
            .await
            .unwrap(),
        Reservation::Reserved
    ));
    assert!(matches!(
        store
            .reserve(&k, &fp, &Arc::from("exec_2"), lease, TTL)
            .await
            .unwrap(),
        Reservation::Running { .. }
    ));
    advance(lease + Duration::from_millis(50)).await;
    for retry in ["exec_3", "exec_4"] {
        match store
            .reserve(&k, &fp, &Arc::from(retry), lease, TTL)
            .await
            .unwrap()
        {
            Reservation::Uncertain { execution_id } => assert_eq!(&*execution_id, "exec_dead"),
            other => panic!("expected uncertain, got {other:?}"),
        }
    }
    store
        .finish(&k, Finish::Response(&response("exec_dead")), TTL)
        .await
        .unwrap();
    match store
        .reserve(&k, &fp, &Arc::from("exec_5"), lease, TTL)
        .await
        .unwrap()
    {
        Reservation::Finished(stored) => assert_eq!(stored, response("exec_dead")),
        other => panic!("expected the late outcome, got {other:?}"),
    }
}

/// A running record lives until its lease, however short the ttl: a duplicate waits for the
/// execution, it never runs a second time.
pub(crate) async fn running_outlives_its_ttl<F: std::future::Future<Output = ()>>(
    store: &dyn KeyStore,
    ttl: Duration,
    advance: impl Fn(Duration) -> F,
) {
    let (k, fp) = (key("outlives"), fingerprint("t", 1));
    assert!(matches!(
        store
            .reserve(&k, &fp, &Arc::from("exec_long"), LEASE, ttl)
            .await
            .unwrap(),
        Reservation::Reserved
    ));
    advance(ttl + Duration::from_millis(100)).await;
    match store
        .reserve(&k, &fp, &Arc::from("exec_2"), LEASE, ttl)
        .await
        .unwrap()
    {
        Reservation::Running { .. } => {}
        other => panic!("a running record expired at its ttl: {other:?}"),
    }
    store
        .finish(&k, Finish::Response(&response("exec_long")), ttl)
        .await
        .unwrap();
    match store
        .reserve(&k, &fp, &Arc::from("exec_3"), LEASE, ttl)
        .await
        .unwrap()
    {
        Reservation::Finished(stored) => assert_eq!(stored, response("exec_long")),
        other => panic!("expected the outcome, got {other:?}"),
    }
}

/// `release` is fenced by the execution id: an execution whose record was taken over (its
/// lease passed, the record expired, another execution claimed the key) frees nothing.
pub(crate) async fn release_is_fenced<F: std::future::Future<Output = ()>>(
    store: &dyn KeyStore,
    lease: Duration,
    advance: impl Fn(Duration) -> F,
) {
    let (k, fp) = (key("fenced"), fingerprint("t", 1));
    assert!(matches!(
        store
            .reserve(&k, &fp, &Arc::from("exec_old"), lease, lease)
            .await
            .unwrap(),
        Reservation::Reserved
    ));
    advance(2 * lease + Duration::from_millis(100)).await;
    assert!(
        matches!(
            reserve(store, &k, &fp, "exec_new").await,
            Reservation::Reserved
        ),
        "the lapsed record was taken over"
    );
    // The old execution, late, lets go of what it no longer holds: nothing happens.
    store.release(&k, "exec_old").await.unwrap();
    match reserve(store, &k, &fp, "exec_3").await {
        Reservation::Running { .. } => {}
        other => panic!("the old owner released the new owner's record: {other:?}"),
    }
    // Its owner does release it.
    store.release(&k, "exec_new").await.unwrap();
    assert!(matches!(
        reserve(store, &k, &fp, "exec_4").await,
        Reservation::Reserved
    ));
}

/// Concurrent reservations of one key: exactly one wins.
pub(crate) async fn one_winner(store: Arc<dyn KeyStore>, contenders: usize) {
    let barrier = Arc::new(tokio::sync::Barrier::new(contenders));
    let tasks: Vec<_> = (0..contenders)
        .map(|index| {
            let store = store.clone();
            let barrier = barrier.clone();
            tokio::spawn(async move {
                let (k, fp) = (key("contended"), fingerprint("t", 1));
                barrier.wait().await;
                let reservation = store
                    .reserve(&k, &fp, &Arc::from(format!("exec_{index}")), LEASE, TTL)
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

// ---- memory ----

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
        Purge::Counted,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn memory_lease_expiry() {
    lease_expiry(
        &MemoryStore::new(),
        Duration::from_secs(30),
        tokio::time::advance,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn memory_running_outlives_its_ttl() {
    running_outlives_its_ttl(
        &MemoryStore::new(),
        Duration::from_secs(1),
        tokio::time::advance,
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn memory_release_is_fenced() {
    release_is_fenced(
        &MemoryStore::new(),
        Duration::from_secs(30),
        tokio::time::advance,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_one_winner_among_200() {
    one_winner(Arc::new(MemoryStore::new()), 200).await;
}

// ---- file ----

#[tokio::test]
async fn file_lifecycle() {
    let file = TempFile::new("lifecycle");
    lifecycle(&file_store(&file).await).await;
}

#[tokio::test]
async fn file_waiters_are_woken() {
    let file = TempFile::new("waiters");
    waiters_are_woken(Arc::new(file_store(&file).await)).await;
}

#[tokio::test]
async fn file_expiry() {
    let file = TempFile::new("expiry");
    expiry(
        &file_store(&file).await,
        Duration::from_millis(300),
        sleep,
        Purge::Counted,
    )
    .await;
}

#[tokio::test]
async fn file_lease_expiry() {
    let file = TempFile::new("lease");
    lease_expiry(&file_store(&file).await, Duration::from_millis(300), sleep).await;
}

#[tokio::test]
async fn file_running_outlives_its_ttl() {
    let file = TempFile::new("outlives");
    running_outlives_its_ttl(&file_store(&file).await, Duration::from_millis(300), sleep).await;
}

#[tokio::test]
async fn file_release_is_fenced() {
    let file = TempFile::new("fenced");
    release_is_fenced(&file_store(&file).await, Duration::from_millis(300), sleep).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_one_winner_among_200() {
    let file = TempFile::new("winner");
    one_winner(Arc::new(file_store(&file).await), 200).await;
}

// ---- PostgreSQL (CARMY_TEST_POSTGRES_URL) ----

#[tokio::test]
async fn postgres_lifecycle() {
    let Some(store) = postgres_store().await else {
        return;
    };
    lifecycle(&store).await;
}

#[tokio::test]
async fn postgres_waiters_are_woken() {
    let Some(store) = postgres_store().await else {
        return;
    };
    waiters_are_woken(Arc::new(store)).await;
}

#[tokio::test]
async fn postgres_expiry() {
    let Some(store) = postgres_store().await else {
        return;
    };
    expiry(&store, Duration::from_millis(300), sleep, Purge::Counted).await;
}

#[tokio::test]
async fn postgres_lease_expiry() {
    let Some(store) = postgres_store().await else {
        return;
    };
    lease_expiry(&store, Duration::from_millis(300), sleep).await;
}

#[tokio::test]
async fn postgres_running_outlives_its_ttl() {
    let Some(store) = postgres_store().await else {
        return;
    };
    running_outlives_its_ttl(&store, Duration::from_millis(300), sleep).await;
}

#[tokio::test]
async fn postgres_release_is_fenced() {
    let Some(store) = postgres_store().await else {
        return;
    };
    release_is_fenced(&store, Duration::from_millis(300), sleep).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_one_winner_among_200() {
    let Some(store) = postgres_store().await else {
        return;
    };
    one_winner(Arc::new(store), 200).await;
}

// ---- Redis (CARMY_TEST_REDIS_URL) ----

#[tokio::test]
async fn redis_lifecycle() {
    let Some(store) = redis_store().await else {
        return;
    };
    lifecycle(&store).await;
}

#[tokio::test]
async fn redis_waiters_are_woken() {
    let Some(store) = redis_store().await else {
        return;
    };
    waiters_are_woken(Arc::new(store)).await;
}

#[tokio::test]
async fn redis_expiry() {
    let Some(store) = redis_store().await else {
        return;
    };
    expiry(&store, Duration::from_millis(300), sleep, Purge::ByEngine).await;
}

#[tokio::test]
async fn redis_lease_expiry() {
    let Some(store) = redis_store().await else {
        return;
    };
    lease_expiry(&store, Duration::from_millis(300), sleep).await;
}

#[tokio::test]
async fn redis_running_outlives_its_ttl() {
    let Some(store) = redis_store().await else {
        return;
    };
    running_outlives_its_ttl(&store, Duration::from_millis(300), sleep).await;
}

#[tokio::test]
async fn redis_release_is_fenced() {
    let Some(store) = redis_store().await else {
        return;
    };
    release_is_fenced(&store, Duration::from_millis(300), sleep).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_one_winner_among_200() {
    let Some(store) = redis_store().await else {
        return;
    };
    one_winner(Arc::new(store), 200).await;
}
