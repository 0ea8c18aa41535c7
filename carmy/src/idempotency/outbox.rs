//! What a store keeps for event delivery (`protocol.md` §8): the subscriptions made through the
//! API, and the outbox — one delivery per event and subscription, written before the action
//! that caused the event is answered, claimed by one replica per attempt, kept until it is
//! delivered or has failed for good.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

/// Attempts kept per subscription for `GET …/deliveries`: the latest ones.
pub const KEPT_ATTEMPTS: usize = 100;

/// A subscription made through the API, as the store keeps it.
#[derive(Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    /// `evt_…`: the `webhook-id`, the receivers' deduplication key.
    pub event_id: Arc<str>,
    /// Its type (wire name).
    pub event_type: Arc<str>,
    /// The JSON body `{"type", "timestamp", "data"}`.
    pub body: Bytes,
}

/// A delivery one replica has claimed for one attempt, until its lease passes.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// One attempt, as `GET /agent/events/subscriptions/{id}/deliveries` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// What happens to a delivery after an attempt.
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
