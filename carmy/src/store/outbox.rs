//! The events' contract (`protocol.md` §8): the subscriptions made through the API, and the
//! outbox — one delivery per event and subscription, written before the action that caused
//! the event is answered, claimed by one replica per attempt, kept until it is delivered or has
//! failed for good.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::StoreError;

/// Attempts kept per subscription for `GET …/deliveries`: the latest ones.
pub const KEPT_ATTEMPTS: usize = 100;

/// A subscription made through the API, as the store keeps it.
///
/// Non-exhaustive: made with [`StoredSubscription::new`], then completed through its fields.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoredSubscription {
    /// `sub_…`.
    pub id: Arc<str>,
    /// Where deliveries go.
    pub url: String,
    /// The event types it receives (wire names).
    pub event_types: Vec<String>,
    /// The operator's note.
    pub description: Option<String>,
    /// The signing key (the bytes behind `whsec_…`).
    pub secret: Box<[u8]>,
    /// The key it replaced on rotation, which keeps signing until the given time.
    pub previous_secret: Option<(Box<[u8]>, SystemTime)>,
    /// When it was created.
    pub created_at: SystemTime,
    /// Why it was disabled; `None` while it is enabled.
    pub disabled_reason: Option<String>,
    /// Since when its attempts have failed without a success in between.
    pub failing_since: Option<SystemTime>,
}

impl StoredSubscription {
    /// The enabled subscription `id`, created at `created_at`, that delivers the events of
    /// `event_types` to `url`, signed with `secret`; no description, no previous secret.
    pub fn new(
        id: impl Into<Arc<str>>,
        url: impl Into<String>,
        event_types: Vec<String>,
        secret: Box<[u8]>,
        created_at: SystemTime,
    ) -> Self {
        StoredSubscription {
            id: id.into(),
            url: url.into(),
            event_types,
            description: None,
            secret,
            previous_secret: None,
            created_at,
            disabled_reason: None,
            failing_since: None,
        }
    }
}

impl std::fmt::Debug for StoredSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("StoredSubscription")
            .field("id", &self.id)
            .field("url", &self.url)
            .field("event_types", &self.event_types)
            .field("disabled_reason", &self.disabled_reason)
            .finish_non_exhaustive()
    }
}

/// An event, written once and sent as is on every attempt.
///
/// Non-exhaustive: made with [`OutboxEvent::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct OutboxEvent {
    /// `evt_…`: the `webhook-id`, the receivers' deduplication key.
    pub event_id: Arc<str>,
    /// Its type (wire name).
    pub event_type: Arc<str>,
    /// The JSON body `{"type", "timestamp", "data"}`.
    pub body: Bytes,
}

impl OutboxEvent {
    /// The event `event_id` of type `event_type`, its JSON body `body`.
    pub fn new(
        event_id: impl Into<Arc<str>>,
        event_type: impl Into<Arc<str>>,
        body: Bytes,
    ) -> Self {
        OutboxEvent {
            event_id: event_id.into(),
            event_type: event_type.into(),
            body,
        }
    }
}

/// A delivery one replica has claimed for one attempt, until its lease passes.
///
/// Non-exhaustive: made with [`ClaimedDelivery::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimedDelivery {
    /// The subscription it goes to.
    pub subscription_id: Arc<str>,
    /// The event.
    pub event: OutboxEvent,
    /// Attempts made before this one.
    pub attempts: u32,
    /// This claim's token: finishing with a stale claim (its lease passed and another replica
    /// claimed the delivery) changes nothing.
    pub claim: Arc<str>,
}

impl ClaimedDelivery {
    /// The delivery of `event` to `subscription_id`, after `attempts` attempts, claimed with
    /// the token `claim`.
    pub fn new(
        subscription_id: impl Into<Arc<str>>,
        event: OutboxEvent,
        attempts: u32,
        claim: impl Into<Arc<str>>,
    ) -> Self {
        ClaimedDelivery {
            subscription_id: subscription_id.into(),
            event,
            attempts,
            claim: claim.into(),
        }
    }
}

/// One attempt, as `GET /agent/events/subscriptions/{id}/deliveries` shows it.
///
/// Non-exhaustive: made with [`DeliveryAttempt::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeliveryAttempt {
    /// The event it delivered.
    pub event_id: Arc<str>,
    /// When it started.
    pub at: SystemTime,
    /// The receiver's status code, if it answered.
    pub status: Option<u16>,
    /// How long it took.
    pub duration: Duration,
    /// Why it failed.
    pub error: Option<String>,
}

impl DeliveryAttempt {
    /// An attempt to deliver `event_id`, started `at`, that took `duration`; with the
    /// receiver's `status` if it answered, and why it failed.
    pub fn new(
        event_id: impl Into<Arc<str>>,
        at: SystemTime,
        status: Option<u16>,
        duration: Duration,
        error: Option<String>,
    ) -> Self {
        DeliveryAttempt {
            event_id: event_id.into(),
            at,
            status,
            duration,
            error,
        }
    }
}

/// What happens to a delivery after an attempt.
///
/// Exhaustive on purpose: a store carries out each case its own way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterAttempt {
    /// Delivered: it leaves the outbox.
    Delivered,
    /// Tried again after this delay (counted by the store's clock).
    RetryIn(Duration),
    /// No more attempts (the schedule is spent, or the subscription is gone or disabled): it
    /// leaves the outbox, marked failed in the log.
    Failed,
}

/// A new claim token: unique, so a stale claim never matches a newer one.
pub(crate) fn new_claim() -> Arc<str> {
    Arc::from(uuid::Uuid::now_v7().to_string())
}

/// Where event subscriptions and the outbox live (`protocol.md` §8). Every shipped engine keeps
/// them; a host that implements only [`KeyStore`](super::KeyStore) gets them from the
/// in-memory engine.
pub trait EventStore: Send + Sync + 'static {
    /// Saves `subscription`, replacing the one with its id.
    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The subscription `id`.
    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>>;

    /// Every subscription, oldest first.
    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>>;

    /// Deletes the subscription `id` with its pending deliveries and its attempts; whether it
    /// existed.
    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Writes `event` with one delivery per subscription of `subscription_ids`, each due now;
    /// durable (as the store is) once this returns. The subscriptions need not be in the store
    /// (those of the configuration file are not).
    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Claims up to `limit` deliveries that are due and unclaimed (or whose claim's lease has
    /// passed: its replica died), the earliest due first, each for `lease`. Replicas claiming
    /// together never get the same delivery.
    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>>;

    /// Logs `attempt` of a claimed delivery (the latest [`KEPT_ATTEMPTS`] per subscription are
    /// kept), then removes the delivery or schedules its next attempt, as `after` says. With a
    /// stale claim (another replica claimed the delivery since) only the log changes.
    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The latest `limit` attempts of deliveries to `subscription_id`, newest first.
    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>>;

    /// How many deliveries wait in the outbox, due or not (its size is bounded).
    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>>;

    /// Checks that the store answers, for the health checks (run in the background, never per
    /// request). `None`, the default, for a store in the process: nothing to check.
    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        None
    }
}

/// A shared store (`connect` returns one) is a store too.
impl<S: EventStore + ?Sized> EventStore for Arc<S> {
    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).save_subscription(subscription)
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        (**self).subscription(id)
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        (**self).subscriptions()
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).delete_subscription(id)
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).enqueue_event(event, subscription_ids)
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        (**self).claim_deliveries(limit, lease)
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).finish_attempt(claimed, attempt, after)
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        (**self).delivery_attempts(subscription_id, limit)
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        (**self).pending_deliveries()
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        (**self).ping()
    }
}
