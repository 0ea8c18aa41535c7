//! The contract every `IdempotencyStore` keeps, written once and run against each backend:
//! memory and file always; PostgreSQL and Redis when `CARMY_TEST_POSTGRES_URL` and
//! `CARMY_TEST_REDIS_URL` name servers (`.ci/run` sets both). Plus each store's own properties.
//! Time is tokio's paused clock where the backend's clock allows it, the real clock elsewhere.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use carmy::Category;
use carmy::ExecutionStatus;
use carmy::idempotency::{
    Cancellation, ExecutionQuery, ExecutionState, FileStore, Fingerprint, Finish, IdempotencyKey,
    IdempotencyStore, MemoryStore, PostgresStore, RecordedEvent, RecordedOutcome, RedisStore,
    Reservation, StoredResponse,
};
use carmy_tests::{run_id, server_url};

const TTL: Duration = Duration::from_secs(60);
const LEASE: Duration = Duration::from_secs(60);

/// Keys of this run only: reruns and the backends' tests never see each other's records.
fn key(request_id: &str) -> IdempotencyKey {
    IdempotencyKey::new(format!("caller-{}", run_id()), request_id)
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
    execution_id: &str,
) -> Reservation {
    store
        .reserve(key, fingerprint, &Arc::from(execution_id), LEASE, TTL)
        .await
        .expect("store works")
}

/// Executions kept for their callers (protocol.md §9): begin, progress bounded to the latest
/// 100, cancellation, end, lookup scoped to the caller, and the list, newest first.
pub(crate) async fn executions_contract(store: &dyn IdempotencyStore, name: &str) {
    assert!(store.keeps_executions());
    let alice = format!("alice-{name}-{}", run_id());
    let bob = format!("bob-{name}-{}", run_id());
    let id = |n: u32| -> Arc<str> { Arc::from(format!("exec_{}-{name}-{n:03}", run_id())) };
    let (first, second, third, bobs) = (id(1), id(2), id(3), id(4));
    for (caller, execution) in [
        (&alice, &first),
        (&alice, &second),
        (&alice, &third),
        (&bob, &bobs),
    ] {
        let tool = if *execution == third {
            "report"
        } else {
            "create_order"
        };
        store
            .begin_execution(caller, execution, tool, LEASE)
            .await
            .unwrap();
    }
    let running = store.execution(&alice, &first).await.unwrap().unwrap();
    assert_eq!(&*running.tool, "create_order");
    assert_eq!(running.state(), ExecutionState::Running);
    assert!(running.outcome.is_none() && running.progress.is_empty() && !running.cancel_requested);
    assert_eq!(
        store.execution(&bob, &first).await.unwrap(),
        None,
        "another caller's"
    );
    assert_eq!(store.execution(&alice, "exec_missing").await.unwrap(), None);

    for event in 2..=151_u64 {
        let data = Bytes::from(format!("{{\"progress\":{event}}}"));
        store
            .record_progress(&first, RecordedEvent { id: event, data })
            .await
            .unwrap();
    }
    let ids = |record: &carmy::idempotency::ExecutionRecord| -> Vec<u64> {
        record.progress.iter().map(|event| event.id).collect()
    };
    let record = store.execution(&alice, &first).await.unwrap().unwrap();
    assert_eq!(
        ids(&record),
        (52..=151).collect::<Vec<_>>(),
        "the latest 100 are kept"
    );
    assert_eq!(&record.progress[99].data[..], b"{\"progress\":151}");

    assert_eq!(
        store.cancel_execution(&bob, &first).await.unwrap(),
        Cancellation::NotFound
    );
    assert!(
        !store
            .execution(&alice, &first)
            .await
            .unwrap()
            .unwrap()
            .cancel_requested
    );
    assert_eq!(
        store.cancel_execution(&alice, &first).await.unwrap(),
        Cancellation::Requested
    );
    assert!(
        store
            .execution(&alice, &first)
            .await
            .unwrap()
            .unwrap()
            .cancel_requested
    );

    let cancelled = StoredResponse {
        execution_id: Arc::clone(&first),
        status: ExecutionStatus::Cancelled,
        category: Some(Category::Cancelled),
        code: Some(Arc::from("CANCELLED")),
        body: Bytes::from_static(b"{\"status\":\"cancelled\"}"),
    };
    let ended = RecordedOutcome {
        response: cancelled,
        event_id: 152,
    };
    store
        .end_execution(&first, ended.clone(), TTL)
        .await
        .unwrap();
    // Once ended, late progress and a second end change nothing.
    store
        .record_progress(
            &first,
            RecordedEvent {
                id: 153,
                data: Bytes::from_static(b"{}"),
            },
        )
        .await
        .unwrap();
    let other_end = RecordedOutcome {
        response: response(&first),
        event_id: 200,
    };
    store.end_execution(&first, other_end, TTL).await.unwrap();
    let record = store.execution(&alice, &first).await.unwrap().unwrap();
    assert_eq!(record.outcome, Some(ended));
    assert_eq!(
        record.state(),
        ExecutionState::Ended(ExecutionStatus::Cancelled)
    );
    assert_eq!(ids(&record).last(), Some(&151));
    assert_eq!(
        store.cancel_execution(&alice, &first).await.unwrap(),
        Cancellation::Ended
    );
    assert_eq!(
        store
            .cancel_execution(&alice, "exec_missing")
            .await
            .unwrap(),
        Cancellation::NotFound
    );

    let completed = RecordedOutcome {
        response: response(&second),
        event_id: 2,
    };
    store.end_execution(&second, completed, TTL).await.unwrap();

    let list = |query: ExecutionQuery| {
        let alice = alice.clone();
        async move {
            store
                .executions(&alice, &query)
                .await
                .unwrap()
                .into_iter()
                .map(|summary| (summary.execution_id.to_string(), summary.state))
                .collect::<Vec<_>>()
        }
    };
    let all = ExecutionQuery {
        limit: 10,
        ..ExecutionQuery::default()
    };
    assert_eq!(
        list(all.clone()).await,
        [
            (third.to_string(), ExecutionState::Running),
            (
                second.to_string(),
                ExecutionState::Ended(ExecutionStatus::Completed)
            ),
            (
                first.to_string(),
                ExecutionState::Ended(ExecutionStatus::Cancelled)
            ),
        ]
    );
    let page = ExecutionQuery {
        limit: 1,
        before: Some(third.to_string()),
        ..all.clone()
    };
    assert_eq!(
        list(page).await,
        [(
            second.to_string(),
            ExecutionState::Ended(ExecutionStatus::Completed)
        )]
    );
    let running = ExecutionQuery {
        state: Some(ExecutionState::Running),
        ..all.clone()
    };
    assert_eq!(
        list(running).await,
        [(third.to_string(), ExecutionState::Running)]
    );
    let cancelled = ExecutionQuery {
        state: Some(ExecutionState::Ended(ExecutionStatus::Cancelled)),
        ..all.clone()
    };
    assert_eq!(list(cancelled).await.len(), 1);
    let orders = ExecutionQuery {
        tool: Some("create_order".to_owned()),
        ..all.clone()
    };
    assert_eq!(list(orders).await.len(), 2);
    let bobs_list = store.executions(&bob, &all).await.unwrap();
    assert_eq!(bobs_list.len(), 1);
    assert_eq!(bobs_list[0].execution_id, bobs);
}

#[tokio::test]
async fn memory_keeps_executions() {
    executions_contract(&MemoryStore::new(), "memory").await;
}

#[tokio::test]
async fn memory_executions_have_a_byte_bound_that_never_drops_a_running_one() {
    const BUDGET: usize = 64 * 1024;
    let store = MemoryStore::with_limits(1_000, BUDGET);
    let big = Bytes::from(vec![b'x'; 8 * 1024]);
    let mut ended = Vec::new();
    for n in 0..20 {
        let id: Arc<str> = Arc::from(format!("exec_bound-{n:03}"));
        store
            .begin_execution("alice", &id, "report", LEASE)
            .await
            .unwrap();
        let outcome = RecordedOutcome {
            response: StoredResponse {
                body: big.clone(),
                ..response(&id)
            },
            event_id: 2,
        };
        store.end_execution(&id, outcome, TTL).await.unwrap();
        ended.push(id);
        assert!(store.execution_bytes() <= BUDGET);
    }
    // The oldest ended ones were dropped, the newest kept.
    assert_eq!(store.execution("alice", &ended[0]).await.unwrap(), None);
    assert!(
        store
            .execution("alice", &ended[19])
            .await
            .unwrap()
            .is_some()
    );
    // Running executions are never dropped: once only they remain, a new one is refused.
    let mut refused = false;
    for n in 0..1_000 {
        let id: Arc<str> = Arc::from(format!("exec_running-{n:04}"));
        if store
            .begin_execution("alice", &id, "report", LEASE)
            .await
            .is_err()
        {
            refused = true;
            break;
        }
    }
    assert!(
        refused,
        "the bound refuses new executions once only running ones remain"
    );
    assert!(store.execution_bytes() <= BUDGET);
    assert!(
        store
            .execution("alice", "exec_running-0000")
            .await
            .unwrap()
            .is_some()
    );
}

/// reserve → running → finished → replay; conflict; release; uncertain; only the execution
/// that reserved a key finishes it.
pub(crate) async fn lifecycle(store: &dyn IdempotencyStore) {
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
    let failure = StoredResponse {
        status: ExecutionStatus::Failed,
        category: Some(carmy::Category::Conflict),
        code: Some(Arc::from("OUT_OF_STOCK")),
        ..response("exec_f")
    };
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
pub(crate) async fn waiters_are_woken(store: Arc<dyn IdempotencyStore>) {
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
    store: &dyn IdempotencyStore,
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
    store: &dyn IdempotencyStore,
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
    store: &dyn IdempotencyStore,
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
    store: &dyn IdempotencyStore,
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

/// The real clock, for backends whose records follow it.
async fn sleep(duration: Duration) {
    tokio::time::sleep(duration).await;
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

#[tokio::test(start_paused = true)]
async fn memory_store_evicts_the_oldest_finished_records_first_never_a_running_one() {
    let store = MemoryStore::with_capacity(3);
    assert_eq!(store.capacity(), 3);
    let fp = fingerprint("t", 1);
    for id in ["a", "b"] {
        assert!(matches!(
            reserve(&store, &key(id), &fp, id).await,
            Reservation::Reserved
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        store
            .finish(&key(id), Finish::Response(&response(id)), TTL)
            .await
            .unwrap();
    }
    assert!(matches!(
        reserve(&store, &key("running"), &fp, "running").await,
        Reservation::Reserved
    ));
    assert_eq!(store.len(), 3);

    // Full: the oldest finished record, "a", makes room for "c".
    assert!(matches!(
        reserve(&store, &key("c"), &fp, "exec_c").await,
        Reservation::Reserved
    ));
    assert_eq!(store.len(), 3);
    // "b" is still there; the next reservation evicts it, the last finished record…
    assert!(matches!(
        reserve(&store, &key("b"), &fp, "exec_b").await,
        Reservation::Finished(_)
    ));
    assert!(matches!(
        reserve(&store, &key("d"), &fp, "exec_d").await,
        Reservation::Reserved
    ));
    // …and then only running records remain: nothing is evicted, the store is full.
    assert!(matches!(
        reserve(&store, &key("e"), &fp, "exec_e").await,
        Reservation::Full
    ));
    assert!(
        matches!(
            reserve(&store, &key("a"), &fp, "exec_a").await,
            Reservation::Full
        ),
        "a is gone"
    );
    for running in ["running", "c", "d"] {
        assert!(
            matches!(
                reserve(&store, &key(running), &fp, "exec_dup").await,
                Reservation::Running { .. }
            ),
            "{running}"
        );
    }
}

#[tokio::test]
async fn memory_store_is_bounded_by_bytes_and_never_evicts_a_running_record() {
    const BUDGET: usize = 64 * 1024;
    let store = MemoryStore::with_limits(1_000, BUDGET);
    let fp = fingerprint("t", 1);
    let large = |id: &str| StoredResponse {
        body: Bytes::from(vec![b'x'; 10 * 1024]),
        ..response(id)
    };
    for index in 0..20 {
        let id = format!("big-{index}");
        assert!(matches!(
            reserve(&store, &key(&id), &fp, &id).await,
            Reservation::Reserved
        ));
        store
            .finish(&key(&id), Finish::Response(&large(&id)), TTL)
            .await
            .unwrap();
        assert!(store.bytes() <= BUDGET, "{} bytes", store.bytes());
    }
    // The oldest finished answers made room; the newest is kept.
    assert!(matches!(
        reserve(&store, &key("big-0"), &fp, "again").await,
        Reservation::Reserved
    ));
    assert!(matches!(
        reserve(&store, &key("big-19"), &fp, "again").await,
        Reservation::Finished(_)
    ));
    // Running records are never evicted: once only they remain, the store is full.
    let mut running = Vec::new();
    let full = loop {
        let id = format!("running-{}-{}", running.len(), "r".repeat(1024));
        match reserve(&store, &key(&id), &fp, &id).await {
            Reservation::Reserved => running.push(id),
            Reservation::Full => break true,
            other => panic!("unexpected {other:?}"),
        }
        if running.len() > 1_000 {
            break false;
        }
    };
    assert!(full, "the byte budget never filled");
    assert!(store.bytes() <= BUDGET);
    for id in &running {
        assert!(
            matches!(
                reserve(&store, &key(id), &fp, "dup").await,
                Reservation::Running { .. }
            ),
            "{id} was evicted"
        );
    }
    // An answer larger than the whole budget is not kept; the record says the call happened.
    let store = MemoryStore::with_limits(1_000, BUDGET);
    let huge = key("huge");
    reserve(&store, &huge, &fp, "exec_huge").await;
    let answer = StoredResponse {
        body: Bytes::from(vec![b'x'; 2 * BUDGET]),
        ..response("exec_huge")
    };
    store
        .finish(&huge, Finish::Response(&answer), TTL)
        .await
        .unwrap();
    assert!(store.bytes() <= BUDGET);
    match reserve(&store, &huge, &fp, "exec_retry").await {
        Reservation::Uncertain { execution_id } => assert_eq!(&*execution_id, "exec_huge"),
        other => panic!("expected uncertain, got {other:?}"),
    }
}

// ---- the file store ----

/// A store file of this run, deleted when dropped.
pub(crate) struct TempFile(pub(crate) PathBuf);

impl TempFile {
    pub(crate) fn new(name: &str) -> Self {
        TempFile(std::env::temp_dir().join(format!("carmy-{}-{name}.redb", run_id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

async fn file_store(file: &TempFile) -> FileStore {
    FileStore::open(&file.0)
        .await
        .expect("the store file opens")
}

#[tokio::test]
async fn file_keeps_executions() {
    let file = TempFile::new("executions");
    executions_contract(&file_store(&file).await, "file").await;
}

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

#[tokio::test]
async fn file_records_survive_reopening_and_the_file_has_one_owner() {
    let file = TempFile::new("reopen");
    let (k, fp) = (key("kept"), fingerprint("create_order", 1));
    {
        let store = file_store(&file).await;
        assert!(matches!(
            reserve(&store, &k, &fp, "exec_1").await,
            Reservation::Reserved
        ));
        store
            .finish(&k, Finish::Response(&response("exec_1")), TTL)
            .await
            .unwrap();
        let second = carmy::idempotency::connect(&format!("file:{}", file.0.display())).await;
        assert!(second.is_err(), "a second process must not open the file");
    }
    let reopened = file_store(&file).await;
    match reserve(&reopened, &k, &fp, "exec_2").await {
        Reservation::Finished(stored) => assert_eq!(stored, response("exec_1")),
        other => panic!("expected the recorded response after reopening, got {other:?}"),
    }
}

// ---- PostgreSQL (CARMY_TEST_POSTGRES_URL) ----

async fn postgres_store() -> Option<PostgresStore> {
    let url = server_url("CARMY_TEST_POSTGRES_URL")?;
    Some(
        PostgresStore::connect(&url).await.unwrap_or_else(|error| {
            panic!("CARMY_TEST_POSTGRES_URL={url} is unreachable: {error}")
        }),
    )
}

#[tokio::test]
async fn postgres_keeps_executions() {
    let Some(store) = postgres_store().await else {
        return;
    };
    executions_contract(&store, "postgres").await;
}

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

/// Replicas starting together: each applies the migrations or finds them applied, under the
/// advisory lock; every step is recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_migrations_apply_once_when_replicas_start_together() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let starts: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresStore::connect(&url).await })
        })
        .collect();
    for start in starts {
        start.await.unwrap().expect("every replica starts");
    }
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let rows = client
        .query(
            "SELECT version, count(*) FROM carmy_idempotency_migrations GROUP BY version",
            &[],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty());
    for row in rows {
        assert_eq!(
            row.get::<_, i64>(1),
            1,
            "migration {} applied twice",
            row.get::<_, i32>(0)
        );
    }
}

/// Expired rows go without anyone calling `purge_expired`: the store's own periodic cleanup.
#[tokio::test]
async fn postgres_cleanup_deletes_expired_records_on_its_own() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let store = PostgresStore::connect_with_cleanup(&url, Duration::from_millis(100))
        .await
        .unwrap();
    let (k, fp) = (key("cleaned"), fingerprint("t", 1));
    let ttl = Duration::from_millis(50);
    store
        .reserve(&k, &fp, &Arc::from("exec_1"), LEASE, ttl)
        .await
        .unwrap();
    store
        .finish(&k, Finish::Response(&response("exec_1")), ttl)
        .await
        .unwrap();
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let rows = || async {
        client
            .query_one(
                "SELECT count(*) FROM carmy_idempotency_records WHERE caller = $1 AND request_id = $2",
                &[&k.caller(), &k.request_id()],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    assert_eq!(rows().await, 1);
    // The cleanup runs every 100 ms; a loaded machine may delay a run, never skip it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rows().await != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the expired row is still there after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- Redis (CARMY_TEST_REDIS_URL) ----

async fn redis_store() -> Option<RedisStore> {
    let url = server_url("CARMY_TEST_REDIS_URL")?;
    Some(
        RedisStore::connect(&url)
            .await
            .unwrap_or_else(|error| panic!("CARMY_TEST_REDIS_URL={url} is unreachable: {error}")),
    )
}

#[tokio::test]
async fn redis_keeps_executions() {
    let Some(store) = redis_store().await else {
        return;
    };
    executions_contract(&store, "redis").await;
}

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
