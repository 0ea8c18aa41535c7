//! The memory engine's events (`protocol.md` §8): subscriptions, the outbox and the attempt
//! logs in this process, under one lock.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::MemoryStore;
use crate::store::outbox::new_claim;
use crate::store::{
    AfterAttempt, ClaimedDelivery, DeliveryAttempt, EventStore, KEPT_ATTEMPTS, OutboxEvent,
    StoreError, StoredSubscription,
};

/// The outbox of an in-process store, bounded by the bytes of its pending deliveries.
pub(super) struct MemoryOutbox {
    inner: Mutex<Outbox>,
    max_bytes: usize,
}

#[derive(Default)]
struct Outbox {
    subscriptions: HashMap<Arc<str>, StoredSubscription>,
    /// Per subscription id, its deliveries by event id.
    deliveries: HashMap<Arc<str>, HashMap<Arc<str>, Delivery>>,
    /// Every delivery as (due, subscription id, event id): the order they are claimed in.
    due: BTreeSet<(Instant, Arc<str>, Arc<str>)>,
    /// Per subscription id, the latest attempts, newest first.
    attempts: HashMap<Arc<str>, VecDeque<DeliveryAttempt>>,
    /// The sum of the deliveries' [`weight`]s.
    bytes: usize,
}

struct Delivery {
    event: OutboxEvent,
    attempts: u32,
    /// When it may be claimed: its next attempt, or the end of its claim's lease.
    due: Instant,
    claim: Option<Arc<str>>,
}

/// What a delivery takes in memory: its fixed parts, its ids and its event (counted whole for
/// each subscription even though the body is shared).
fn weight(subscription_id: &str, event: &OutboxEvent) -> usize {
    const FIXED: usize = size_of::<Delivery>()
        + size_of::<(Instant, Arc<str>, Arc<str>)>()
        // The `Arc` headers, a claim token, hash table and tree slack.
        + 4 * 16
        + 64;
    FIXED + 2 * subscription_id.len() + 2 * event.event_id.len() + event.body.len()
}

impl MemoryOutbox {
    pub(super) fn new(max_bytes: usize) -> Self {
        MemoryOutbox {
            inner: Mutex::new(Outbox::default()),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Outbox> {
        // No code panics while holding the lock; recover the data if it ever happens.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn save_subscription(&self, subscription: &StoredSubscription) {
        self.lock()
            .subscriptions
            .insert(Arc::clone(&subscription.id), subscription.clone());
    }

    pub(super) fn subscription(&self, id: &str) -> Option<StoredSubscription> {
        self.lock().subscriptions.get(id).cloned()
    }

    /// Oldest first (ties by id).
    pub(super) fn subscriptions(&self) -> Vec<StoredSubscription> {
        let mut all: Vec<_> = self.lock().subscriptions.values().cloned().collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        all
    }

    pub(super) fn delete_subscription(&self, id: &str) -> bool {
        let mut outbox = self.lock();
        let outbox = &mut *outbox;
        if let Some((subscription_id, deliveries)) = outbox.deliveries.remove_entry(id) {
            for (event_id, delivery) in deliveries {
                outbox.bytes -= weight(&subscription_id, &delivery.event);
                outbox
                    .due
                    .remove(&(delivery.due, Arc::clone(&subscription_id), event_id));
            }
        }
        outbox.attempts.remove(id);
        outbox.subscriptions.remove(id).is_some()
    }

    /// All or nothing: refused when the deliveries would take the outbox over its bound. A
    /// delivery of the same event to the same subscription is written once.
    pub(super) fn enqueue_event(
        &self,
        event: &OutboxEvent,
        subscription_ids: &[Arc<str>],
    ) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut outbox = self.lock();
        let outbox = &mut *outbox;
        // At most this much: deliveries written already take nothing more.
        let incoming: usize = subscription_ids.iter().map(|id| weight(id, event)).sum();
        if outbox.bytes + incoming > self.max_bytes {
            return Err(StoreError::message(format!(
                "the outbox is full: {} bytes of pending deliveries, at most {}",
                outbox.bytes, self.max_bytes
            )));
        }
        for id in subscription_ids {
            let deliveries = outbox.deliveries.entry(Arc::clone(id)).or_default();
            if let Entry::Vacant(vacant) = deliveries.entry(Arc::clone(&event.event_id)) {
                vacant.insert(Delivery {
                    event: event.clone(),
                    attempts: 0,
                    due: now,
                    claim: None,
                });
                outbox.bytes += weight(id, event);
                outbox
                    .due
                    .insert((now, Arc::clone(id), Arc::clone(&event.event_id)));
            }
        }
        Ok(())
    }

    /// The earliest due first; each is due again when its lease passes.
    pub(super) fn claim_deliveries(&self, limit: usize, lease: Duration) -> Vec<ClaimedDelivery> {
        let now = Instant::now();
        let mut outbox = self.lock();
        let outbox = &mut *outbox;
        let ready: Vec<_> = outbox
            .due
            .iter()
            .take_while(|(due, _, _)| *due <= now)
            .take(limit)
            .cloned()
            .collect();
        let mut claimed = Vec::with_capacity(ready.len());
        for key in ready {
            outbox.due.remove(&key);
            let (_, subscription_id, event_id) = key;
            let Some(delivery) = outbox
                .deliveries
                .get_mut(&subscription_id)
                .and_then(|deliveries| deliveries.get_mut(&event_id))
            else {
                continue;
            };
            let claim = new_claim();
            delivery.due = now + lease;
            delivery.claim = Some(Arc::clone(&claim));
            outbox
                .due
                .insert((delivery.due, Arc::clone(&subscription_id), event_id));
            claimed.push(ClaimedDelivery {
                subscription_id,
                event: delivery.event.clone(),
                attempts: delivery.attempts,
                claim,
            });
        }
        claimed
    }

    pub(super) fn finish_attempt(
        &self,
        claimed: &ClaimedDelivery,
        attempt: &DeliveryAttempt,
        after: AfterAttempt,
    ) {
        let now = Instant::now();
        let mut outbox = self.lock();
        let outbox = &mut *outbox;
        let log = outbox
            .attempts
            .entry(Arc::clone(&claimed.subscription_id))
            .or_default();
        log.push_front(attempt.clone());
        log.truncate(KEPT_ATTEMPTS);
        let Some(deliveries) = outbox.deliveries.get_mut(&claimed.subscription_id) else {
            return;
        };
        let event_id = &claimed.event.event_id;
        let Some(delivery) = deliveries
            .get_mut(event_id)
            .filter(|delivery| delivery.claim.as_ref() == Some(&claimed.claim))
        else {
            return;
        };
        outbox.due.remove(&(
            delivery.due,
            Arc::clone(&claimed.subscription_id),
            Arc::clone(event_id),
        ));
        match after {
            AfterAttempt::RetryIn(delay) => {
                delivery.attempts += 1;
                delivery.due = now + delay;
                delivery.claim = None;
                outbox.due.insert((
                    delivery.due,
                    Arc::clone(&claimed.subscription_id),
                    Arc::clone(event_id),
                ));
            }
            AfterAttempt::Delivered | AfterAttempt::Failed => {
                outbox.bytes -= weight(&claimed.subscription_id, &delivery.event);
                deliveries.remove(event_id);
                if deliveries.is_empty() {
                    outbox.deliveries.remove(&claimed.subscription_id);
                }
            }
        }
    }

    pub(super) fn delivery_attempts(
        &self,
        subscription_id: &str,
        limit: usize,
    ) -> Vec<DeliveryAttempt> {
        self.lock()
            .attempts
            .get(subscription_id)
            .map(|log| log.iter().take(limit).cloned().collect())
            .unwrap_or_default()
    }

    pub(super) fn pending_deliveries(&self) -> usize {
        self.lock().due.len()
    }
}

impl EventStore for MemoryStore {
    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.outbox.save_subscription(subscription);
        Box::pin(std::future::ready(Ok(())))
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.outbox.subscription(id))))
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        Box::pin(std::future::ready(Ok(self.outbox.subscriptions())))
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(self.outbox.delete_subscription(id))))
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(std::future::ready(
            self.outbox.enqueue_event(event, subscription_ids),
        ))
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        Box::pin(std::future::ready(Ok(self
            .outbox
            .claim_deliveries(limit, lease))))
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.outbox.finish_attempt(claimed, attempt, after);
        Box::pin(std::future::ready(Ok(())))
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        Box::pin(std::future::ready(Ok(self
            .outbox
            .delivery_attempts(subscription_id, limit))))
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(std::future::ready(Ok(self.outbox.pending_deliveries())))
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn event(id: &str, body_bytes: usize) -> OutboxEvent {
        OutboxEvent {
            event_id: Arc::from(id),
            event_type: Arc::from("execution.finished"),
            body: Bytes::from(vec![b'x'; body_bytes]),
        }
    }

    fn attempt(event_id: &str) -> DeliveryAttempt {
        DeliveryAttempt {
            event_id: Arc::from(event_id),
            at: std::time::SystemTime::now(),
            status: Some(204),
            duration: Duration::from_millis(3),
            error: None,
        }
    }

    #[test]
    fn a_full_outbox_refuses_new_events_whole_until_deliveries_leave() {
        let outbox = MemoryOutbox::new(8 * 1024);
        let subscriptions = [Arc::from("sub_a"), Arc::from("sub_b")];
        let mut written = 0;
        let full = loop {
            match outbox.enqueue_event(&event(&format!("evt_{written}"), 1024), &subscriptions) {
                Ok(()) => written += 1,
                Err(full) => break full,
            }
        };
        assert!(written > 0, "some events fit");
        assert!(full.to_string().contains("the outbox is full"), "{full}");
        assert_eq!(
            outbox.pending_deliveries(),
            2 * written,
            "nothing of the refused one"
        );
        assert!(outbox.lock().bytes <= 8 * 1024);

        let claimed = outbox.claim_deliveries(2, Duration::from_secs(60));
        assert_eq!(claimed.len(), 2);
        for delivery in &claimed {
            let attempt = attempt(&delivery.event.event_id);
            outbox.finish_attempt(delivery, &attempt, AfterAttempt::Delivered);
        }
        outbox
            .enqueue_event(&event("evt_after", 1024), &subscriptions)
            .expect("room again once deliveries left");
    }

    #[test]
    fn deleting_every_delivery_frees_every_byte() {
        let outbox = MemoryOutbox::new(1024 * 1024);
        let subscriptions = [Arc::from("sub_a"), Arc::from("sub_b")];
        for n in 0..10 {
            outbox
                .enqueue_event(&event(&format!("evt_{n}"), 100), &subscriptions)
                .unwrap();
        }
        // The same event again writes nothing more.
        outbox
            .enqueue_event(&event("evt_0", 100), &subscriptions)
            .unwrap();
        assert_eq!(outbox.pending_deliveries(), 20);
        let claimed = outbox.claim_deliveries(3, Duration::from_secs(60));
        let retry = attempt(&claimed[0].event.event_id);
        outbox.finish_attempt(&claimed[0], &retry, AfterAttempt::RetryIn(Duration::ZERO));
        outbox.delete_subscription("sub_a");
        outbox.delete_subscription("sub_b");
        assert_eq!(outbox.pending_deliveries(), 0);
        assert_eq!(outbox.lock().bytes, 0);
    }
}
