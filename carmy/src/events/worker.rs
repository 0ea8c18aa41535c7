//! The delivery worker: claims due deliveries from the outbox (one replica per attempt), makes
//! each attempt with bounded concurrency, and records what follows — delivered, retried on the
//! schedule (with jitter, or after the receiver's `Retry-After`), failed for good, or the
//! subscription disabled (`410 Gone`, or failing for `disable_after`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::policy::{EventPolicy, EventType};
use super::service::{Events, now_millis};
use crate::store::{AfterAttempt, ClaimedDelivery, DeliveryAttempt, StoredSubscription};
use crate::webhook::{AttemptOutcome, SigningSecret};

/// Attempts in flight at once, across all subscriptions.
const CONCURRENT_ATTEMPTS: usize = 32;
/// Attempts in flight at once to one subscription: a slow receiver holds at most these slots,
/// never all of them, so the others' deliveries go on.
const PER_SUBSCRIPTION: usize = 8;
/// Claimed deliveries waiting for their subscription's turn, across all subscriptions.
const MAX_WAITING: usize = 1024;
/// Claims per wake-up at most: the worker never spins through a large outbox at once.
const MAX_CLAIM_ROUNDS: usize = 16;
/// How often the outbox is looked at when nothing was written here (a retry coming due, an
/// event written by another replica, a claim whose replica died).
const POLL: Duration = Duration::from_millis(500);
/// A claim outlives its attempt by this much before another replica may take it over.
const LEASE_MARGIN: Duration = Duration::from_secs(10);
/// A delivery waiting for its subscription's turn starts within this of its claim, or not at
/// all (its claim lapses, and it is claimed again once the lease has passed): an attempt
/// never outlives its claim.
const START_WITHIN: Duration = Duration::from_secs(5);

/// Delivers until `stop` fires or the app is gone (its last handle on `events` dropped).
pub(crate) async fn run(events: Weak<Events>, stop: CancellationToken) {
    let Some(written) = events.upgrade().map(|events| Arc::clone(&events.written)) else {
        return;
    };
    let slots = Arc::new(Semaphore::new(CONCURRENT_ATTEMPTS));
    let turns = Arc::new(Turns::default());
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = written.notified() => {}
            () = tokio::time::sleep(POLL) => {}
        }
        let Some(events) = events.upgrade() else {
            return;
        };
        // Also while events are off: a drop shown before they were turned off passes again.
        events.forget_old_drops();
        let Some(settings) = events.settings() else {
            continue;
        };
        if let Ok(pending) = events.store.pending_deliveries().await {
            events.pending.store(pending, Ordering::Relaxed);
        }
        // Claim as many as there are free slots, again while every slot gets one (those that
        // wait for their subscription's turn hold none).
        for _ in 0..MAX_CLAIM_ROUNDS {
            let free = slots.available_permits();
            if free == 0 {
                break;
            }
            let lease = settings.attempt_timeout + LEASE_MARGIN;
            let claimed = match events.store.claim_deliveries(free, lease).await {
                Ok(claimed) => claimed,
                Err(error) => {
                    tracing::warn!(%error, "could not claim event deliveries");
                    break;
                }
            };
            let full = claimed.len() == free;
            let start_by = tokio::time::Instant::now() + START_WITHIN;
            for delivery in claimed {
                if !turns.take(&delivery, start_by) {
                    continue;
                }
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let (events, settings) = (Arc::clone(&events), Arc::clone(&settings));
                let turns = Arc::clone(&turns);
                tokio::spawn(async move {
                    // The turn passes to the subscription's next waiting delivery, if any.
                    let subscription = Arc::clone(&delivery.subscription_id);
                    let mut next = Some(delivery);
                    while let Some(delivery) = next {
                        deliver(&events, &settings, delivery).await;
                        next = turns.next(&subscription);
                    }
                    drop(slot);
                });
            }
            if !full {
                break;
            }
        }
    }
}

/// The attempts in flight per subscription, and the claimed deliveries waiting for a turn.
#[derive(Default)]
struct Turns(std::sync::Mutex<TurnsInner>);

#[derive(Default)]
struct TurnsInner {
    in_flight: HashMap<Arc<str>, usize>,
    waiting: HashMap<Arc<str>, VecDeque<(ClaimedDelivery, tokio::time::Instant)>>,
    waiting_count: usize,
}

impl Turns {
    fn lock(&self) -> std::sync::MutexGuard<'_, TurnsInner> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `delivery` may be attempted now. If not, it waits for its subscription's turn
    /// (to start by `start_by`), or, with too many waiting, its claim lapses.
    fn take(&self, delivery: &ClaimedDelivery, start_by: tokio::time::Instant) -> bool {
        let mut inner = self.lock();
        let in_flight = inner
            .in_flight
            .entry(Arc::clone(&delivery.subscription_id))
            .or_default();
        if *in_flight < PER_SUBSCRIPTION {
            *in_flight += 1;
            return true;
        }
        if inner.waiting_count >= MAX_WAITING {
            inner.forget_late();
        }
        if inner.waiting_count < MAX_WAITING {
            inner
                .waiting
                .entry(Arc::clone(&delivery.subscription_id))
                .or_default()
                .push_back((delivery.clone(), start_by));
            inner.waiting_count += 1;
        }
        false
    }

    /// The subscription's next waiting delivery that may still start, its turn passed on;
    /// `None` (the turn given back) when there is none.
    fn next(&self, subscription: &Arc<str>) -> Option<ClaimedDelivery> {
        let mut inner = self.lock();
        let now = tokio::time::Instant::now();
        let mut found = None;
        if let Some(queue) = inner.waiting.get_mut(subscription) {
            let mut taken = 0;
            while let Some((delivery, start_by)) = queue.pop_front() {
                taken += 1;
                if start_by > now {
                    found = Some(delivery);
                    break;
                }
            }
            if queue.is_empty() {
                inner.waiting.remove(subscription);
            }
            inner.waiting_count -= taken;
        }
        if found.is_none()
            && let Some(in_flight) = inner.in_flight.get_mut(subscription)
        {
            *in_flight -= 1;
            if *in_flight == 0 {
                inner.in_flight.remove(subscription);
            }
        }
        found
    }
}

impl TurnsInner {
    /// Lets the claims of the waiting deliveries too late to start lapse.
    fn forget_late(&mut self) {
        let now = tokio::time::Instant::now();
        let mut forgotten = 0;
        self.waiting.retain(|_, queue| {
            let before = queue.len();
            queue.retain(|(_, start_by)| *start_by > now);
            forgotten += before - queue.len();
            !queue.is_empty()
        });
        self.waiting_count -= forgotten;
    }
}

/// Where a delivery goes and how it is signed.
struct Target {
    url: String,
    secrets: Vec<SigningSecret>,
    /// The stored subscription, whose failure state the attempt updates; `None` for one the
    /// file declares.
    stored: Option<StoredSubscription>,
}

/// One attempt of one claimed delivery, and what follows it.
async fn deliver(events: &Events, settings: &EventPolicy, delivery: ClaimedDelivery) {
    let target = match target(events, settings, &delivery.subscription_id).await {
        Ok(Some(target)) => target,
        Ok(None) => {
            // Deleted or disabled since the event was written: nothing more to try.
            let attempt = skipped(&delivery, "the subscription is disabled or gone");
            finish(events, &delivery, &attempt, AfterAttempt::Failed).await;
            return;
        }
        // The claim's lease passes and the delivery is tried again.
        Err(()) => return,
    };
    let secrets: Vec<&SigningSecret> = target.secrets.iter().collect();
    let made = settings
        .deliverer
        .attempt(
            &target.url,
            &secrets,
            &delivery.event.event_id,
            &delivery.event.body,
        )
        .await;
    let attempt = DeliveryAttempt {
        event_id: Arc::clone(&delivery.event.event_id),
        at: made.at,
        status: made.status,
        duration: made.duration,
        error: made.error.clone(),
    };
    let after = match made.outcome {
        AttemptOutcome::Delivered => {
            if target
                .stored
                .is_some_and(|stored| stored.failing_since.is_some())
            {
                update(events, &delivery.subscription_id, |fresh| {
                    fresh.failing_since.take().is_some()
                })
                .await;
            }
            AfterAttempt::Delivered
        }
        AttemptOutcome::Gone => {
            if target.stored.is_some() {
                disable(
                    events,
                    &delivery.subscription_id,
                    "the receiver answered 410 Gone",
                )
                .await;
            } else {
                tracing::warn!(
                    subscription = &*delivery.subscription_id,
                    "a subscription declared in carmy.toml answered 410 Gone; remove it there"
                );
            }
            AfterAttempt::Failed
        }
        AttemptOutcome::Failed { retry_after } => {
            let after = next_attempt(&settings.retry_schedule, delivery.attempts, retry_after);
            if target.stored.is_some() {
                let mut failing_since = None;
                update(events, &delivery.subscription_id, |fresh| {
                    let first = fresh.failing_since.is_none();
                    failing_since = Some(*fresh.failing_since.get_or_insert(made.at));
                    first
                })
                .await;
                let failing_for = failing_since
                    .and_then(|since| SystemTime::now().duration_since(since).ok())
                    .unwrap_or_default();
                if failing_since.is_some() && failing_for >= settings.disable_after {
                    let reason = format!(
                        "its deliveries failed for {} without a success",
                        humantime::format_duration(settings.disable_after)
                    );
                    disable(events, &delivery.subscription_id, &reason).await;
                }
            }
            after
        }
    };
    finish(events, &delivery, &attempt, after).await;
}

/// The subscription a delivery goes to: the file's, else the store's if it is enabled.
/// `Ok(None)` when it is gone or disabled; `Err` when the store cannot say.
async fn target(events: &Events, settings: &EventPolicy, id: &str) -> Result<Option<Target>, ()> {
    if let Some(declared) = settings.declared(id) {
        return Ok(Some(Target {
            url: declared.url.clone(),
            secrets: vec![declared.secret.clone()],
            stored: None,
        }));
    }
    let stored = events.store.subscription(id).await.map_err(|error| {
        tracing::warn!(%error, "could not read a subscription to deliver to");
    })?;
    let Some(stored) = stored.filter(|stored| stored.disabled_reason.is_none()) else {
        return Ok(None);
    };
    let mut secrets = Vec::with_capacity(2);
    secrets.extend(SigningSecret::from_bytes(&stored.secret).ok());
    if let Some((previous, until)) = &stored.previous_secret
        && *until > SystemTime::now()
    {
        secrets.extend(SigningSecret::from_bytes(previous).ok());
    }
    Ok(Some(Target {
        url: stored.url.clone(),
        secrets,
        stored: Some(stored),
    }))
}

/// The retry after `attempts_before` failed attempts plus this one: the schedule's next delay
/// with ±10 % jitter (so receivers coming back are not hit by every retry at once), or the
/// receiver's `Retry-After` when longer; failed once the schedule is spent.
fn next_attempt(
    schedule: &[Duration],
    attempts_before: u32,
    retry_after: Option<Duration>,
) -> AfterAttempt {
    let index = usize::try_from(attempts_before).unwrap_or(usize::MAX);
    let Some(delay) = schedule.get(index) else {
        return AfterAttempt::Failed;
    };
    let jitter = 0.9 + 0.2 * random_unit();
    let delay = delay.mul_f64(jitter);
    AfterAttempt::RetryIn(retry_after.map_or(delay, |asked| asked.max(delay)))
}

/// A number in [0, 1) from the OS's randomness.
fn random_unit() -> f64 {
    let mut bytes = [0; 4];
    getrandom::fill(&mut bytes).unwrap_or_default();
    f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0)
}

/// Changes what the worker keeps on a subscription (since when it fails, why it is disabled)
/// on a fresh read, saved when `change` says it changed something: what the API changed while
/// the attempt was in flight (a rotation, a `PATCH`) is kept, and a subscription deleted
/// meanwhile stays deleted. The saved subscription, if any.
async fn update(
    events: &Events,
    id: &str,
    change: impl FnOnce(&mut StoredSubscription) -> bool,
) -> Option<StoredSubscription> {
    let mut fresh = match events.store.subscription(id).await {
        Ok(fresh) => fresh?,
        Err(error) => {
            tracing::warn!(%error, "could not read a subscription to update");
            return None;
        }
    };
    if !change(&mut fresh) {
        return None;
    }
    if let Err(error) = events.save(&fresh).await {
        tracing::warn!(error = error.message(), "could not update a subscription");
        return None;
    }
    Some(fresh)
}

/// Disables a subscription (unless it is gone or disabled already) and tells the subscribers
/// of `subscription.disabled`.
async fn disable(events: &Events, id: &str, reason: &str) {
    let Some(stored) = update(events, id, |fresh| {
        if fresh.disabled_reason.is_some() {
            return false;
        }
        fresh.disabled_reason = Some(reason.to_owned());
        true
    })
    .await
    else {
        return;
    };
    tracing::warn!(
        subscription = &*stored.id,
        url = stored.url,
        reason,
        "event subscription disabled"
    );
    events
        .publish(
            EventType::SubscriptionDisabled,
            || json!({ "id": &*stored.id, "url": stored.url, "reason": reason }),
        )
        .await;
}

fn skipped(delivery: &ClaimedDelivery, why: &str) -> DeliveryAttempt {
    DeliveryAttempt {
        event_id: Arc::clone(&delivery.event.event_id),
        at: now_millis(),
        status: None,
        duration: Duration::ZERO,
        error: Some(why.to_owned()),
    }
}

async fn finish(
    events: &Events,
    delivery: &ClaimedDelivery,
    attempt: &DeliveryAttempt,
    after: AfterAttempt,
) {
    if after == AfterAttempt::Failed {
        tracing::warn!(
            subscription = &*delivery.subscription_id,
            event = &*delivery.event.event_id,
            error = attempt.error.as_deref().unwrap_or(""),
            "event delivery failed for good"
        );
    }
    if let Err(error) = events.store.finish_attempt(delivery, attempt, after).await {
        tracing::warn!(%error, "could not record an event delivery attempt");
    }
}

/// Turns the app's health transitions and catalog changes into `health.changed` and
/// `tools.changed`, until the app is gone.
pub(crate) async fn forward_changes(
    events: Weak<Events>,
    mut health: tokio::sync::broadcast::Receiver<crate::health::HealthChanged>,
    mut tools: tokio::sync::broadcast::Receiver<crate::reload::ToolsChanged>,
) {
    use tokio::sync::broadcast::error::RecvError;
    loop {
        let (kind, data) = tokio::select! {
            changed = health.recv() => match changed {
                Ok(changed) => (EventType::HealthChanged, json!({
                    "from": changed.from.as_str(),
                    "to": changed.to.as_str(),
                    "reason": changed.reason,
                    "since": humantime::format_rfc3339_millis(changed.since).to_string(),
                })),
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            },
            changed = tools.recv() => match changed {
                Ok(changed) => {
                    let versions: serde_json::Map<String, serde_json::Value> =
                        crate::principal::TrustLevel::ALL
                            .iter()
                            .map(|trust| {
                                (trust.as_str().to_owned(), json!(changed.tools_version(*trust)))
                            })
                            .collect();
                    let widest = changed.tools_version(crate::principal::TrustLevel::Internal);
                    (EventType::ToolsChanged, json!({
                        "tools_version": widest,
                        "tools_versions": versions,
                    }))
                }
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return,
            },
        };
        let Some(events) = events.upgrade() else {
            return;
        };
        events.publish(kind, || data).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_follow_the_schedule_with_jitter_then_fail() {
        let schedule = [Duration::from_secs(5), Duration::from_secs(300)];
        for _ in 0..100 {
            let AfterAttempt::RetryIn(first) = next_attempt(&schedule, 0, None) else {
                panic!("a first retry");
            };
            assert!((4_500..=5_500).contains(&first.as_millis()), "{first:?}");
        }
        let AfterAttempt::RetryIn(second) = next_attempt(&schedule, 1, None) else {
            panic!("a second retry");
        };
        assert!(second >= Duration::from_secs(270), "{second:?}");
        assert_eq!(next_attempt(&schedule, 2, None), AfterAttempt::Failed);
    }

    #[test]
    fn a_longer_retry_after_is_honoured() {
        let schedule = [Duration::from_secs(1)];
        let asked = Duration::from_secs(120);
        assert_eq!(
            next_attempt(&schedule, 0, Some(asked)),
            AfterAttempt::RetryIn(asked)
        );
    }
}
