//! Each engine's own properties, beyond the contracts: the memory engine's bounds, what the
//! file engine keeps across reopening, PostgreSQL's migrations and periodic cleanup.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use carmy::store::{
    AfterAttempt, EventStore, ExecutionStore, FileStore, Finish, KeyStore, MemoryStore,
    PostgresStore, RecordedOutcome, Reservation,
};
use carmy_tests::server_url;

use super::events::{attempt, event, subscription};
use super::keys::reserve;
use super::{LEASE, TTL, TempFile, file_store, fingerprint, key, response, response_with_body};

// ---- memory ----

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
    let large = |id: &str| response_with_body(id, Bytes::from(vec![b'x'; 10 * 1024]));
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
    let answer = response_with_body("exec_huge", Bytes::from(vec![b'x'; 2 * BUDGET]));
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
        let outcome = RecordedOutcome::new(response_with_body(&id, big.clone()), 2);
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

// ---- file ----

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
        let second = carmy::store::connect(&format!("file:{}", file.0.display())).await;
        assert!(second.is_err(), "a second process must not open the file");
    }
    let reopened = file_store(&file).await;
    match reserve(&reopened, &k, &fp, "exec_2").await {
        Reservation::Finished(stored) => assert_eq!(stored, response("exec_1")),
        other => panic!("expected the recorded response after reopening, got {other:?}"),
    }
}

/// What the file keeps of events outlives the process: subscriptions, pending deliveries with
/// their attempts made, the log; a delivery claimed by the process that died is claimed again
/// once its lease passes.
#[tokio::test]
async fn file_outbox_survives_reopening() {
    let file = TempFile::new("outbox-reopen");
    let saved = subscription("sub_kept", SystemTime::now());
    let (retried, in_flight) = (event("evt_retried"), event("evt_in_flight"));
    let failed = attempt("evt_retried", Some(500), Some("HTTP 500"));
    let lease = Duration::from_secs(2);
    let claimed_at = {
        let store = FileStore::open(&file.0).await.unwrap();
        store.save_subscription(&saved).await.unwrap();
        for outgoing in [&retried, &in_flight] {
            store
                .enqueue_event(outgoing, &[Arc::clone(&saved.id)])
                .await
                .unwrap();
        }
        let claimed = store.claim_deliveries(16, lease).await.unwrap();
        let claimed_at = tokio::time::Instant::now();
        assert_eq!(claimed.len(), 2);
        let first = claimed
            .iter()
            .find(|c| c.event.event_id == retried.event_id)
            .unwrap();
        store
            .finish_attempt(first, &failed, AfterAttempt::RetryIn(Duration::ZERO))
            .await
            .unwrap();
        // The process dies with the other delivery claimed.
        claimed_at
    };

    let store = FileStore::open(&file.0).await.unwrap();
    assert_eq!(
        store.subscriptions().await.unwrap(),
        std::slice::from_ref(&saved)
    );
    assert_eq!(store.pending_deliveries().await.unwrap(), 2);
    assert_eq!(
        store.delivery_attempts(&saved.id, 10).await.unwrap(),
        [failed]
    );
    let pending = store.claim_deliveries(16, LEASE).await.unwrap();
    assert_eq!(
        pending.len(),
        1,
        "only the delivery that was not claimed: {pending:?}"
    );
    assert_eq!(pending[0].event, retried);
    assert_eq!(pending[0].attempts, 1, "its attempt counted");
    assert!(
        claimed_at.elapsed() < lease,
        "the test ran too slowly to see the lease hold"
    );

    tokio::time::sleep_until(claimed_at + lease + Duration::from_millis(50)).await;
    let resumed = store.claim_deliveries(16, LEASE).await.unwrap();
    assert_eq!(resumed.len(), 1, "claimed again once its lease passed");
    assert_eq!(resumed[0].event, in_flight);
    assert_eq!(resumed[0].attempts, 0);
    assert_eq!(&*resumed[0].subscription_id, &*saved.id);
}

// ---- PostgreSQL (CARMY_TEST_POSTGRES_URL) ----

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
