//! The events of an app: what happened becomes an event in the outbox, one delivery per
//! subscription that wants it, written before the action that caused it is answered; and the
//! subscriptions made through the API. No HTTP here: `http::events` is the adapter.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::secret::SigningSecret;
use super::settings::{EventSettings, EventType};
use crate::idempotency::{DeliveryAttempt, IdempotencyStore, OutboxEvent, StoredSubscription};
use crate::settings::Current;
use crate::tool_error::ToolError;
use crate::wire::codes;

/// How long the old secret keeps signing after a rotation.
const ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 60 * 60);
/// How long the subscriptions read from the store serve the publishers before they are read
/// again: a subscription made on another replica receives events within this.
const SUBSCRIPTIONS_FRESH_FOR: Duration = Duration::from_secs(1);
/// The outbox's bound: beyond it new events are dropped (and logged), never the caller's
/// answer delayed.
pub(crate) const MAX_PENDING: usize = 100_000;
/// Attempts `GET …/deliveries` shows.
pub(crate) const LISTED_ATTEMPTS: usize = 100;

/// Publishes events and manages subscriptions; shared by the runtime, the worker and the
/// HTTP adapter.
pub(crate) struct Events {
    pub(crate) store: Arc<dyn IdempotencyStore>,
    pub(crate) current: Current,
    /// Wakes the worker when an event is written here.
    pub(crate) written: Arc<Notify>,
    cached: Mutex<Option<(Instant, Arc<[StoredSubscription]>)>>,
    /// The outbox's size as the worker last counted it.
    pub(crate) pending: std::sync::atomic::AtomicUsize,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

/// A subscription as the API shows it (never its secrets).
#[derive(Debug, Clone)]
pub(crate) struct SubscriptionView {
    pub(crate) id: Arc<str>,
    pub(crate) url: String,
    pub(crate) event_types: Vec<String>,
    pub(crate) description: Option<String>,
    pub(crate) created_at: Option<SystemTime>,
    pub(crate) disabled_reason: Option<String>,
    /// Declared in `carmy.toml`: read-only here.
    pub(crate) declared: bool,
}

impl SubscriptionView {
    pub(crate) fn to_json(&self) -> Value {
        let mut view = json!({
            "id": &*self.id,
            "url": self.url,
            "event_types": self.event_types,
            "status": if self.disabled_reason.is_some() { "disabled" } else { "enabled" },
            "source": if self.declared { "config" } else { "api" },
        });
        if let Some(description) = &self.description {
            view["description"] = json!(description);
        }
        if let Some(created_at) = self.created_at {
            view["created_at"] = json!(humantime::format_rfc3339_millis(created_at).to_string());
        }
        if let Some(reason) = &self.disabled_reason {
            view["disabled_reason"] = json!(reason);
        }
        view
    }
}

impl From<&StoredSubscription> for SubscriptionView {
    fn from(stored: &StoredSubscription) -> Self {
        SubscriptionView {
            id: Arc::clone(&stored.id),
            url: stored.url.clone(),
            event_types: stored.event_types.clone(),
            description: stored.description.clone(),
            created_at: Some(stored.created_at),
            disabled_reason: stored.disabled_reason.clone(),
            declared: false,
        }
    }
}

/// What `POST /agent/events/subscriptions` asks for.
#[derive(Debug)]
pub(crate) struct NewSubscription {
    pub(crate) url: String,
    pub(crate) event_types: Vec<String>,
    pub(crate) description: Option<String>,
}

/// What `PATCH …/{id}` changes; what is absent stays.
#[derive(Debug, Default)]
pub(crate) struct SubscriptionChange {
    pub(crate) enabled: Option<bool>,
    pub(crate) event_types: Option<Vec<String>>,
    pub(crate) description: Option<Option<String>>,
}

impl Events {
    pub(crate) fn new(store: Arc<dyn IdempotencyStore>, current: Current) -> Arc<Self> {
        Arc::new(Events {
            store,
            current,
            written: Arc::new(Notify::new()),
            cached: Mutex::new(None),
            pending: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// The `[events]` settings in force; `None` while events are off.
    pub(crate) fn settings(&self) -> Option<Arc<EventSettings>> {
        self.current.load().events.clone()
    }

    /// Writes the event for every enabled subscription that wants it, durably once this
    /// returns; its `data` is built only then. Never fails its caller: a store that cannot
    /// take it is logged.
    pub(crate) async fn publish(&self, kind: EventType, data: impl FnOnce() -> Value) {
        let Some(settings) = self.settings() else {
            return;
        };
        let mut targets: Vec<Arc<str>> = settings
            .declared
            .iter()
            .filter(|declared| declared.event_types.contains(&kind))
            .map(|declared| Arc::clone(&declared.id))
            .collect();
        match self.stored_subscriptions().await {
            Ok(stored) => targets.extend(
                stored
                    .iter()
                    .filter(|subscription| {
                        subscription.disabled_reason.is_none()
                            && subscription.event_types.iter().any(|t| t == kind.as_str())
                    })
                    .map(|subscription| Arc::clone(&subscription.id)),
            ),
            Err(error) => {
                tracing::error!(%error, event = kind.as_str(), "could not read the event subscriptions; the event is not delivered to them");
            }
        }
        if targets.is_empty() {
            return;
        }
        if self.pending.load(std::sync::atomic::Ordering::Relaxed) >= MAX_PENDING {
            tracing::error!(
                event = kind.as_str(),
                max = MAX_PENDING,
                "the event outbox is full; the event is dropped"
            );
            return;
        }
        let event = OutboxEvent {
            event_id: Arc::from(format!("evt_{}", uuid::Uuid::now_v7().simple())),
            event_type: Arc::from(kind.as_str()),
            body: Bytes::from(
                json!({
                    "type": kind.as_str(),
                    "timestamp": humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
                    "data": data(),
                })
                .to_string(),
            ),
        };
        match self.store.enqueue_event(&event, &targets).await {
            Ok(()) => self.written.notify_one(),
            Err(error) => {
                tracing::error!(%error, event = kind.as_str(), "could not write an event to the outbox");
            }
        }
    }

    /// The store's subscriptions, read at most once per [`SUBSCRIPTIONS_FRESH_FOR`].
    async fn stored_subscriptions(
        &self,
    ) -> Result<Arc<[StoredSubscription]>, crate::idempotency::StoreError> {
        if let Some((read_at, subscriptions)) = &*self.lock_cache()
            && read_at.elapsed() < SUBSCRIPTIONS_FRESH_FOR
        {
            return Ok(Arc::clone(subscriptions));
        }
        let subscriptions: Arc<[StoredSubscription]> = self.store.subscriptions().await?.into();
        *self.lock_cache() = Some((Instant::now(), Arc::clone(&subscriptions)));
        Ok(subscriptions)
    }

    fn lock_cache(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<(Instant, Arc<[StoredSubscription]>)>> {
        self.cached
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A change made here is seen by the next publish.
    fn forget_subscriptions(&self) {
        *self.lock_cache() = None;
    }

    /// Creates a subscription: its URL passes the SSRF guard now (and again at every attempt);
    /// nothing is sent to it. The secret is returned once.
    pub(crate) async fn create(
        &self,
        settings: &EventSettings,
        request: NewSubscription,
    ) -> Result<(SubscriptionView, SigningSecret), ToolError> {
        let event_types = checked_event_types(request.event_types)?;
        settings
            .deliverer
            .check_url(&request.url)
            .await
            .map_err(|refusal| {
                ToolError::validation(codes::WEBHOOK_URL_REFUSED, refusal.to_string())
                    .details(json!({ "reason": refusal.to_string() }))
            })?;
        let secret = SigningSecret::generate();
        let stored = StoredSubscription {
            id: Arc::from(format!("sub_{}", uuid::Uuid::now_v7().simple())),
            url: request.url,
            event_types,
            description: request.description,
            secret: Box::from(secret.as_bytes()),
            previous_secret: None,
            created_at: now_millis(),
            disabled_reason: None,
            failing_since: None,
        };
        self.store
            .save_subscription(&stored)
            .await
            .map_err(|error| unavailable(&error))?;
        self.forget_subscriptions();
        Ok((SubscriptionView::from(&stored), secret))
    }

    /// Every subscription: those the file declares, then the store's, oldest first.
    pub(crate) async fn list(
        &self,
        settings: &EventSettings,
    ) -> Result<Vec<SubscriptionView>, ToolError> {
        let stored = self
            .store
            .subscriptions()
            .await
            .map_err(|error| unavailable(&error))?;
        Ok(settings
            .declared
            .iter()
            .map(declared_view)
            .chain(stored.iter().map(SubscriptionView::from))
            .collect())
    }

    pub(crate) async fn get(
        &self,
        settings: &EventSettings,
        id: &str,
    ) -> Result<SubscriptionView, ToolError> {
        if let Some(declared) = settings.declared(id) {
            return Ok(declared_view(declared));
        }
        Ok(SubscriptionView::from(&self.stored(id).await?))
    }

    pub(crate) async fn delete(&self, settings: &EventSettings, id: &str) -> Result<(), ToolError> {
        refuse_declared(settings, id)?;
        let existed = self
            .store
            .delete_subscription(id)
            .await
            .map_err(|error| unavailable(&error))?;
        self.forget_subscriptions();
        if existed { Ok(()) } else { Err(not_found()) }
    }

    /// Re-enables, or changes the event types or the description of, a subscription.
    pub(crate) async fn update(
        &self,
        settings: &EventSettings,
        id: &str,
        change: SubscriptionChange,
    ) -> Result<SubscriptionView, ToolError> {
        refuse_declared(settings, id)?;
        let mut stored = self.stored(id).await?;
        if let Some(event_types) = change.event_types {
            stored.event_types = checked_event_types(event_types)?;
        }
        if let Some(description) = change.description {
            stored.description = description;
        }
        match change.enabled {
            Some(true) => {
                stored.disabled_reason = None;
                stored.failing_since = None;
            }
            Some(false) if stored.disabled_reason.is_none() => {
                stored.disabled_reason = Some("disabled through the API".to_owned());
            }
            _ => {}
        }
        self.save(&stored).await?;
        Ok(SubscriptionView::from(&stored))
    }

    /// A new secret, returned once; the old one keeps signing alongside for 24 hours.
    pub(crate) async fn rotate_secret(
        &self,
        settings: &EventSettings,
        id: &str,
    ) -> Result<(SubscriptionView, SigningSecret), ToolError> {
        refuse_declared(settings, id)?;
        let mut stored = self.stored(id).await?;
        let secret = SigningSecret::generate();
        let old = std::mem::replace(&mut stored.secret, Box::from(secret.as_bytes()));
        stored.previous_secret = Some((old, now_millis() + ROTATION_OVERLAP));
        self.save(&stored).await?;
        Ok((SubscriptionView::from(&stored), secret))
    }

    /// The latest attempts to deliver to a subscription, newest first.
    pub(crate) async fn deliveries(
        &self,
        settings: &EventSettings,
        id: &str,
    ) -> Result<Vec<DeliveryAttempt>, ToolError> {
        if settings.declared(id).is_none() {
            self.stored(id).await?;
        }
        self.store
            .delivery_attempts(id, LISTED_ATTEMPTS)
            .await
            .map_err(|error| unavailable(&error))
    }

    async fn stored(&self, id: &str) -> Result<StoredSubscription, ToolError> {
        self.store
            .subscription(id)
            .await
            .map_err(|error| unavailable(&error))?
            .ok_or_else(not_found)
    }

    pub(crate) async fn save(&self, stored: &StoredSubscription) -> Result<(), ToolError> {
        self.store
            .save_subscription(stored)
            .await
            .map_err(|error| unavailable(&error))?;
        self.forget_subscriptions();
        Ok(())
    }
}

fn declared_view(declared: &super::settings::DeclaredSubscription) -> SubscriptionView {
    SubscriptionView {
        id: Arc::clone(&declared.id),
        url: declared.url.clone(),
        event_types: declared
            .event_types
            .iter()
            .map(|kind| kind.as_str().to_owned())
            .collect(),
        description: None,
        created_at: None,
        disabled_reason: None,
        declared: true,
    }
}

/// The event types of a request: at least one, each known, each once.
fn checked_event_types(event_types: Vec<String>) -> Result<Vec<String>, ToolError> {
    if event_types.is_empty() {
        return Err(invalid("`event_types` must name at least one event type"));
    }
    let mut checked: Vec<String> = Vec::with_capacity(event_types.len());
    for name in event_types {
        if EventType::from_wire(&name).is_none() {
            let known: Vec<&str> = EventType::ALL.iter().map(|kind| kind.as_str()).collect();
            return Err(invalid(&format!("unknown event type `{name}`")).details(
                json!({ "reason": format!("unknown event type `{name}`"), "known": known }),
            ));
        }
        if !checked.contains(&name) {
            checked.push(name);
        }
    }
    Ok(checked)
}

fn invalid(message: &str) -> ToolError {
    ToolError::invalid_request(message.to_owned())
}

fn refuse_declared(settings: &EventSettings, id: &str) -> Result<(), ToolError> {
    if settings.declared(id).is_some() {
        return Err(ToolError::conflict(
            codes::SUBSCRIPTION_DECLARED,
            "this subscription is declared in carmy.toml: change it there",
        ));
    }
    Ok(())
}

fn not_found() -> ToolError {
    ToolError::not_found(codes::SUBSCRIPTION_NOT_FOUND, "no such subscription")
}

pub(crate) fn unavailable(error: &crate::idempotency::StoreError) -> ToolError {
    tracing::error!(%error, "the event store failed");
    ToolError::capacity(codes::EVENTS_UNAVAILABLE, "the event store is unavailable")
        .retryable(Duration::from_secs(1))
}

/// Now, to the millisecond the stores keep.
pub(crate) fn now_millis() -> SystemTime {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    SystemTime::UNIX_EPOCH
        + Duration::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}
