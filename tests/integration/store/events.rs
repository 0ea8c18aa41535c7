//! The contract of every `EventStore` (`protocol.md` §8), written once against the trait and run
//! against each engine: subscriptions, the outbox (one delivery per event and subscription,
//! claimed by one replica per attempt, rescheduled or removed after it), and the attempt log.
//!
//! Each shared engine runs it in a namespace of its own (a PostgreSQL schema, a Redis database),
//! so no other test's deliveries are claimed here, nor these by another test.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use carmy::store::{
    AfterAttempt, ClaimedDelivery, DeliveryAttempt, EventStore, KEPT_ATTEMPTS, MemoryStore,
    OutboxEvent, StoredSubscription,
};
use carmy_tests::{redis_database, run_id, server_url};

use super::{LEASE, TempFile, file_store};

/// A time the stores keep exactly (milliseconds).
fn millis(time: SystemTime) -> SystemTime {
    let since = time.duration_since(UNIX_EPOCH).unwrap();
    UNIX_EPOCH + Duration::from_millis(u64::try_from(since.as_millis()).unwrap())
}

pub(super) fn subscription(id: &str, created_at: SystemTime) -> StoredSubscription {
    let mut subscription = StoredSubscription::new(
        id,
        format!("https://hooks.example.com/{id}"),
        vec!["execution.finished".to_owned(), "tools.changed".to_owned()],
        vec![7; 32].into_boxed_slice(),
        millis(created_at),
    );
    subscription.description = Some(format!("the receiver of {id}"));
    subscription
}

pub(super) fn event(id: &str) -> OutboxEvent {
    OutboxEvent::new(
        id,
        "execution.finished",
        Bytes::from(format!(
            "{{\"type\":\"execution.finished\",\"timestamp\":\"2026-12-01T10:00:00Z\",\"data\":{{\"id\":\"{id}\"}}}}"
        )),
    )
}

pub(super) fn attempt(event_id: &str, status: Option<u16>, error: Option<&str>) -> DeliveryAttempt {
    DeliveryAttempt::new(
        event_id,
        millis(SystemTime::now()),
        status,
        Duration::from_millis(12),
        error.map(str::to_owned),
    )
}

/// Claims until nothing is due, keeping the deliveries of `events` (the store may hold others'
/// from earlier runs: those are finished as failed, out of the way).
async fn claim_ours(
    store: &dyn EventStore,
    events: &HashSet<String>,
    lease: Duration,
) -> Vec<ClaimedDelivery> {
    let mut ours = Vec::new();
    loop {
        let claimed = store.claim_deliveries(16, lease).await.unwrap();
        if claimed.is_empty() {
            return ours;
        }
        for delivery in claimed {
            if events.contains(&*delivery.event.event_id) {
                ours.push(delivery);
            } else {
                let stale = attempt(&delivery.event.event_id, None, Some("left over"));
                store
                    .finish_attempt(&delivery, &stale, AfterAttempt::Failed)
                    .await
                    .unwrap();
            }
        }
    }
}

fn ids(events: &[&str]) -> HashSet<String> {
    events.iter().map(|id| (*id).to_owned()).collect()
}

pub(crate) async fn outbox_contract(store: Arc<dyn EventStore>, name: &str) {
    let run = format!("{name}-{}", run_id());
    let sub = |n: u32| format!("sub_{run}-{n}");
    let evt = |n: u32| format!("evt_{run}-{n}");

    // Whatever an interrupted earlier run left due is cleared out of the way first.
    claim_ours(&*store, &HashSet::new(), Duration::from_millis(1)).await;

    // Subscriptions: saved, read back whole, listed oldest first, replaced, deleted.
    let now = SystemTime::now();
    let mut first = subscription(&sub(1), now - Duration::from_secs(10));
    first.previous_secret = Some((vec![9; 24].into_boxed_slice(), millis(now)));
    let second = subscription(&sub(2), now);
    store.save_subscription(&first).await.unwrap();
    store.save_subscription(&second).await.unwrap();
    assert_eq!(
        store.subscription(&sub(1)).await.unwrap(),
        Some(first.clone())
    );
    let listed: Vec<_> = store
        .subscriptions()
        .await
        .unwrap()
        .into_iter()
        .filter(|listed| listed.id.contains(&run))
        .collect();
    assert_eq!(listed, [first.clone(), second.clone()], "oldest first");
    let mut disabled = first.clone();
    disabled.disabled_reason = Some("HTTP 410 Gone".to_owned());
    disabled.failing_since = Some(millis(now));
    disabled.description = None;
    store.save_subscription(&disabled).await.unwrap();
    assert_eq!(
        store.subscription(&sub(1)).await.unwrap(),
        Some(disabled.clone())
    );
    assert!(store.delete_subscription(&sub(2)).await.unwrap());
    assert!(!store.delete_subscription(&sub(2)).await.unwrap());
    assert_eq!(store.subscription(&sub(2)).await.unwrap(), None);
    assert_eq!(store.subscription("sub_missing").await.unwrap(), None);

    // One delivery per subscription, whether the store holds it or not (a configured one).
    let pending_before = store.pending_deliveries().await.unwrap();
    let configured: Arc<str> = Arc::from(format!("sub_{run}-configured"));
    store
        .enqueue_event(
            &event(&evt(1)),
            &[Arc::from(sub(1)), Arc::clone(&configured)],
        )
        .await
        .unwrap();
    assert_eq!(
        store.pending_deliveries().await.unwrap(),
        pending_before + 2
    );
    let claimed = claim_ours(&*store, &ids(&[&evt(1)]), LEASE).await;
    assert_eq!(claimed.len(), 2, "{claimed:?}");
    let subscriptions: HashSet<&str> = claimed.iter().map(|c| &*c.subscription_id).collect();
    assert_eq!(
        subscriptions,
        HashSet::from([sub(1).as_str(), &*configured])
    );
    for delivery in &claimed {
        assert_eq!(delivery.event, event(&evt(1)), "the event as written");
        assert_eq!(delivery.attempts, 0);
    }
    assert_ne!(claimed[0].claim, claimed[1].claim);
    assert!(
        claim_ours(&*store, &ids(&[&evt(1)]), LEASE)
            .await
            .is_empty(),
        "claimed deliveries are not claimed again while their lease holds"
    );

    // A failed attempt is logged and retried; a success removes the delivery.
    let to_first = claimed
        .iter()
        .find(|c| *c.subscription_id == *sub(1))
        .unwrap()
        .clone();
    let failed = attempt(&evt(1), Some(500), Some("HTTP 500"));
    store
        .finish_attempt(&to_first, &failed, AfterAttempt::RetryIn(Duration::ZERO))
        .await
        .unwrap();
    let retried = claim_ours(&*store, &ids(&[&evt(1)]), LEASE).await;
    assert_eq!(retried.len(), 1);
    assert_eq!(retried[0].attempts, 1, "one attempt made before");
    assert_eq!(retried[0].event, event(&evt(1)));
    let delivered = attempt(&evt(1), Some(204), None);
    store
        .finish_attempt(&retried[0], &delivered, AfterAttempt::Delivered)
        .await
        .unwrap();
    assert_eq!(
        store.delivery_attempts(&sub(1), 10).await.unwrap(),
        [delivered.clone(), failed.clone()],
        "newest first"
    );

    // A later retry is not due yet.
    let to_configured = claimed
        .iter()
        .find(|c| c.subscription_id == configured)
        .unwrap()
        .clone();
    let timed_out = attempt(&evt(1), None, Some("timed out after 15s"));
    store
        .finish_attempt(
            &to_configured,
            &timed_out,
            AfterAttempt::RetryIn(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    assert!(
        claim_ours(&*store, &ids(&[&evt(1)]), LEASE)
            .await
            .is_empty()
    );
    assert_eq!(
        store.pending_deliveries().await.unwrap(),
        pending_before + 1
    );
    // Deleting a subscription the store does not hold still drops its deliveries.
    assert!(!store.delete_subscription(&configured).await.unwrap());
    assert_eq!(store.pending_deliveries().await.unwrap(), pending_before);

    // A claim whose lease passed (its replica died) is claimed again; the stale claim's
    // finish then changes nothing but the log.
    store
        .enqueue_event(&event(&evt(2)), &[Arc::from(sub(1))])
        .await
        .unwrap();
    // One claim only: with a 1 ms lease, claiming until nothing is due would take it again.
    let lapsed: Vec<ClaimedDelivery> = store
        .claim_deliveries(16, Duration::from_millis(1))
        .await
        .unwrap()
        .into_iter()
        .filter(|claimed| *claimed.event.event_id == *evt(2))
        .collect();
    assert_eq!(lapsed.len(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let taken_over = claim_ours(&*store, &ids(&[&evt(2)]), LEASE).await;
    assert_eq!(taken_over.len(), 1, "claimed again once the lease passed");
    assert_ne!(taken_over[0].claim, lapsed[0].claim);
    store
        .finish_attempt(
            &lapsed[0],
            &attempt(&evt(2), Some(200), None),
            AfterAttempt::Delivered,
        )
        .await
        .unwrap();
    store
        .finish_attempt(
            &taken_over[0],
            &attempt(&evt(2), Some(503), Some("HTTP 503")),
            AfterAttempt::RetryIn(Duration::ZERO),
        )
        .await
        .unwrap();
    let still_there = claim_ours(&*store, &ids(&[&evt(2)]), LEASE).await;
    assert_eq!(still_there.len(), 1, "the stale claim removed nothing");
    store
        .finish_attempt(
            &still_there[0],
            &attempt(&evt(2), Some(500), Some("HTTP 500")),
            AfterAttempt::Failed,
        )
        .await
        .unwrap();
    assert!(
        claim_ours(&*store, &ids(&[&evt(2)]), LEASE)
            .await
            .is_empty()
    );

    // The log keeps the latest attempts only.
    store
        .enqueue_event(&event(&evt(3)), &[Arc::from(sub(1))])
        .await
        .unwrap();
    for n in 0..=KEPT_ATTEMPTS {
        let claimed = claim_ours(&*store, &ids(&[&evt(3)]), LEASE).await;
        assert_eq!(claimed.len(), 1);
        let status = u16::try_from(n).unwrap();
        store
            .finish_attempt(
                &claimed[0],
                &attempt(&evt(3), Some(status), None),
                AfterAttempt::RetryIn(Duration::ZERO),
            )
            .await
            .unwrap();
    }
    let log = store
        .delivery_attempts(&sub(1), KEPT_ATTEMPTS + 50)
        .await
        .unwrap();
    assert_eq!(log.len(), KEPT_ATTEMPTS);
    assert_eq!(log[0].status, Some(u16::try_from(KEPT_ATTEMPTS).unwrap()));
    assert_eq!(store.delivery_attempts(&sub(1), 3).await.unwrap().len(), 3);

    // Deleting a subscription drops its deliveries and its log.
    assert!(store.delete_subscription(&sub(1)).await.unwrap());
    assert!(
        claim_ours(&*store, &ids(&[&evt(3)]), LEASE)
            .await
            .is_empty()
    );
    assert!(
        store
            .delivery_attempts(&sub(1), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Replicas claiming side by side never get the same delivery.
    let shared: Arc<str> = Arc::from(sub(4));
    let events: Vec<String> = (100..150).map(evt).collect();
    for id in &events {
        store
            .enqueue_event(&event(id), &[Arc::clone(&shared)])
            .await
            .unwrap();
    }
    let wanted: HashSet<String> = events.iter().cloned().collect();
    let claimers: Vec<_> = (0..8)
        .map(|_| {
            let (store, wanted) = (Arc::clone(&store), wanted.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let claimed = store.claim_deliveries(5, LEASE).await.unwrap();
                    if claimed.is_empty() {
                        return mine;
                    }
                    mine.extend(
                        claimed
                            .into_iter()
                            .filter(|c| wanted.contains(&*c.event.event_id))
                            .map(|c| c.event.event_id.to_string()),
                    );
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for claimer in claimers {
        all.extend(claimer.await.unwrap());
    }
    all.sort();
    let mut expected: Vec<String> = events.clone();
    expected.sort();
    assert_eq!(all, expected, "each delivery claimed exactly once");
    let pending = store.pending_deliveries().await.unwrap();
    assert!(!store.delete_subscription(&shared).await.unwrap());
    assert_eq!(
        store.pending_deliveries().await.unwrap(),
        pending - events.len()
    );
}

#[tokio::test]
async fn memory_keeps_the_outbox() {
    outbox_contract(Arc::new(MemoryStore::new()), "memory").await;
}

#[tokio::test]
async fn file_keeps_the_outbox() {
    let file = TempFile::new("outbox-contract");
    outbox_contract(Arc::new(file_store(&file).await), "file").await;
}

/// The schema of the PostgreSQL contract run: created here, the store migrates it.
const POSTGRES_SCHEMA: &str = "carmy_outbox_contract";

#[tokio::test]
async fn postgres_keeps_the_outbox() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let scoped = carmy_tests::postgres::schema(&url, POSTGRES_SCHEMA).await;
    let store = carmy::store::connect(&scoped).await.unwrap();
    outbox_contract(store, "postgres").await;
}

/// The database of the Redis contract run.
const REDIS_DATABASE: u32 = 7;

#[tokio::test]
async fn redis_keeps_the_outbox() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    let store = carmy::store::connect(&redis_database(&url, REDIS_DATABASE))
        .await
        .unwrap();
    outbox_contract(store, "redis").await;
}

/// Two replicas sharing one outbox (two stores connected to the same namespace): claiming side
/// by side, they never get the same delivery; and a delivery claimed by a replica that dies
/// before it finishes the attempt (dropped, as a killed process) is claimed by the other once
/// that claim's lease has passed.
pub(crate) async fn replicas_share_the_outbox(
    first: Arc<dyn EventStore>,
    second: Arc<dyn EventStore>,
    name: &str,
) {
    let run = format!("{name}-replicas-{}", run_id());
    let shared: Arc<str> = Arc::from(format!("sub_{run}"));
    claim_ours(&*first, &HashSet::new(), Duration::from_millis(1)).await;
    let pending_before = first.pending_deliveries().await.unwrap();

    // Side by side: four claimers on each replica, small batches.
    let events: Vec<String> = (0..60).map(|n| format!("evt_{run}-{n}")).collect();
    for id in &events {
        first
            .enqueue_event(&event(id), &[Arc::clone(&shared)])
            .await
            .unwrap();
    }
    let wanted: HashSet<String> = events.iter().cloned().collect();
    let claimers: Vec<_> = [&first, &second]
        .into_iter()
        .flat_map(|store| std::iter::repeat_n(store, 4))
        .map(|store| {
            let (store, wanted) = (Arc::clone(store), wanted.clone());
            tokio::spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let claimed = store.claim_deliveries(3, LEASE).await.unwrap();
                    if claimed.is_empty() {
                        return (store, mine);
                    }
                    mine.extend(
                        claimed
                            .into_iter()
                            .filter(|c| wanted.contains(&*c.event.event_id)),
                    );
                }
            })
        })
        .collect();
    let mut claimed_ids = Vec::new();
    for claimer in claimers {
        let (store, mine) = claimer.await.unwrap();
        for delivery in mine {
            claimed_ids.push(delivery.event.event_id.to_string());
            let done = attempt(&delivery.event.event_id, Some(204), None);
            store
                .finish_attempt(&delivery, &done, AfterAttempt::Delivered)
                .await
                .unwrap();
        }
    }
    claimed_ids.sort();
    let mut expected = events.clone();
    expected.sort();
    assert_eq!(
        claimed_ids, expected,
        "each delivery claimed by one replica"
    );
    assert_eq!(second.pending_deliveries().await.unwrap(), pending_before);
    assert_eq!(
        first
            .delivery_attempts(&shared, events.len() + 1)
            .await
            .unwrap()
            .len(),
        events.len(),
        "both replicas' attempts in one log"
    );

    // A replica claims and dies: the other takes the delivery over once the lease passes.
    let lost = format!("evt_{run}-lost");
    first
        .enqueue_event(&event(&lost), &[Arc::clone(&shared)])
        .await
        .unwrap();
    let lease = Duration::from_millis(500);
    let held = claim_ours(&*second, &ids(&[&lost]), lease).await;
    assert_eq!(held.len(), 1);
    drop(second);
    assert!(
        claim_ours(&*first, &ids(&[&lost]), LEASE).await.is_empty(),
        "not while the dead replica's lease holds"
    );
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let resumed = claim_ours(&*first, &ids(&[&lost]), LEASE).await;
    assert_eq!(resumed.len(), 1, "claimed again once the lease passed");
    assert_eq!(resumed[0].event, event(&lost));
    assert_eq!(resumed[0].attempts, 0, "the dead replica made no attempt");
    assert_ne!(resumed[0].claim, held[0].claim);
    first
        .finish_attempt(
            &resumed[0],
            &attempt(&lost, Some(200), None),
            AfterAttempt::Delivered,
        )
        .await
        .unwrap();
    assert_eq!(first.pending_deliveries().await.unwrap(), pending_before);
    assert!(!first.delete_subscription(&shared).await.unwrap());
}

/// The schema of the PostgreSQL replica run.
const POSTGRES_REPLICAS_SCHEMA: &str = "carmy_outbox_replicas";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_share_the_outbox() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let scoped = carmy_tests::postgres::schema(&url, POSTGRES_REPLICAS_SCHEMA).await;
    let first = carmy::store::connect(&scoped).await.unwrap();
    let second = carmy::store::connect(&scoped).await.unwrap();
    replicas_share_the_outbox(first, second, "postgres").await;
}

/// The database of the Redis replica run.
const REDIS_REPLICAS_DATABASE: u32 = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_replicas_share_the_outbox() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    let scoped = redis_database(&url, REDIS_REPLICAS_DATABASE);
    let first = carmy::store::connect(&scoped).await.unwrap();
    let second = carmy::store::connect(&scoped).await.unwrap();
    replicas_share_the_outbox(first, second, "redis").await;
}
