//! The events of an app: what happened becomes an event in the outbox, one delivery per
//! subscription that wants it, written before the action that caused it is answered; and the
//! subscriptions made through the API. No HTTP here: `http::events` is the adapter.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use serde_json::{Value, json};
use tokio::sync::Notify;

use super::policy::{DECLARED_PREFIX, EventPolicy, EventType};
use crate::health::Health;
use crate::store::{DeliveryAttempt, EventStore, OutboxEvent, StoredSubscription};
use crate::tool_error::{ToolError, clip};
use crate::webhook::SigningSecret;
use crate::wire::codes;
use crate::wire::subscriptions::{MAX_DESCRIPTION_BYTES, MAX_URL_BYTES};

/// How long the old secret keeps signing after a rotation.
const ROTATION_OVERLAP: Duration = Duration::from_secs(24 * 60 * 60);
/// How long the subscriptions read from the store serve the publishers before they are read
/// again: a subscription made on another replica receives events within this.
const SUBSCRIPTIONS_FRESH_FOR: Duration = Duration::from_secs(1);
/// Attempts `GET …/deliveries` shows.
pub(crate) const LISTED_ATTEMPTS: usize = 100;
/// How long the `events` health check warns after the outbox last dropped an event.
const DROPS_SHOWN_FOR: Duration = Duration::from_secs(5 * 60);

/// The `[events]` settings in force, `None` while events are off: the configuration snapshot
/// reads them on every use, so a reload applies at once.
pub(crate) type InForce = Box<dyn Fn() -> Option<Arc<EventPolicy>> + Send + Sync>;

/// Publishes events and manages subscriptions; shared by the runtime, the worker and the
/// HTTP adapter.
pub(crate) struct Events {
    pub(crate) store: Arc<dyn EventStore>,
    in_force: InForce,
    /// Wakes the worker when an event is written here.
    pub(crate) written: Arc<Notify>,
    cached: Mutex<Option<(Instant, Arc<[StoredSubscription]>)>>,
    /// The outbox's size as the worker last counted it, plus what was written here since.
    pub(crate) pending: std::sync::atomic::AtomicUsize,
    /// Where the `events` check shows dropped events.
    health: Health,
    /// The events dropped lately, the outbox being full.
    drops: Mutex<Option<Drops>>,
    /// Held while a subscription is counted and saved, so that concurrent creations here
    /// cannot pass the bound together.
    creating: tokio::sync::Mutex<()>,
}

/// A run of events the outbox refused, none more than [`DROPS_SHOWN_FOR`] after the last.
struct Drops {
    count: u64,
    since: SystemTime,
    last: Instant,
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

/// A page of the list: subscriptions after `after` (a `next_cursor`, a subscription's id).
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) limit: usize,
    pub(crate) after: Option<String>,
}

/// What `PATCH …/{id}` changes; what is absent stays.
#[derive(Debug, Default)]
pub(crate) struct SubscriptionChange {
    pub(crate) enabled: Option<bool>,
    pub(crate) event_types: Option<Vec<String>>,
    pub(crate) description: Option<Option<String>>,
}

impl Events {
    pub(crate) fn new(store: Arc<dyn EventStore>, in_force: InForce, health: Health) -> Arc<Self> {
        Arc::new(Events {
            store,
            in_force,
            written: Arc::new(Notify::new()),
            cached: Mutex::new(None),
            pending: std::sync::atomic::AtomicUsize::new(0),
            health,
            drops: Mutex::new(None),
            creating: tokio::sync::Mutex::new(()),
        })
    }

    /// The `[events]` settings in force; `None` while events are off.
    pub(crate) fn settings(&self) -> Option<Arc<EventPolicy>> {
        (self.in_force)()
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
        let bound = settings.max_pending_deliveries;
        if self.pending.load(std::sync::atomic::Ordering::Relaxed) >= bound {
            self.dropped(kind, bound);
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
            Ok(()) => {
                // Counted at once: a burst between two of the worker's counts stays bounded.
                self.pending
                    .fetch_add(targets.len(), std::sync::atomic::Ordering::Relaxed);
                self.written.notify_one();
            }
            Err(error) => {
                tracing::error!(%error, event = kind.as_str(), "could not write an event to the outbox");
            }
        }
    }

    /// An event the full outbox refused: logged, and counted in the `events` health check.
    fn dropped(&self, kind: EventType, bound: usize) {
        tracing::error!(
            event = kind.as_str(),
            max = bound,
            "the event outbox is full; the event is dropped"
        );
        let mut drops = lock(&self.drops);
        let drops = drops.get_or_insert_with(|| Drops {
            count: 0,
            since: SystemTime::now(),
            last: Instant::now(),
        });
        drops.count += 1;
        drops.last = Instant::now();
        self.health.report_events(Some(format!(
            "{} events dropped since {}: the outbox holds its bound of {bound} pending deliveries",
            drops.count,
            humantime::format_rfc3339_seconds(drops.since)
        )));
    }

    /// Passes the `events` health check again once no event was dropped for
    /// [`DROPS_SHOWN_FOR`]; the worker calls it on every round.
    pub(crate) fn forget_old_drops(&self) {
        let mut drops = lock(&self.drops);
        if drops
            .as_ref()
            .is_some_and(|drops| drops.last.elapsed() >= DROPS_SHOWN_FOR)
        {
            *drops = None;
            self.health.report_events(None);
        }
    }

    /// The store's subscriptions, read at most once per [`SUBSCRIPTIONS_FRESH_FOR`].
    async fn stored_subscriptions(
        &self,
    ) -> Result<Arc<[StoredSubscription]>, crate::store::StoreError> {
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
        lock(&self.cached)
    }

    /// A change made here is seen by the next publish.
    fn forget_subscriptions(&self) {
        *self.lock_cache() = None;
    }

    /// Creates a subscription: its URL passes the SSRF guard now (and again at every attempt);
    /// nothing is sent to it. The secret is returned once. Beyond `max_subscriptions` made
    /// here, `409 SUBSCRIPTION_LIMIT_REACHED`.
    pub(crate) async fn create(
        &self,
        settings: &EventPolicy,
        request: NewSubscription,
    ) -> Result<(SubscriptionView, SigningSecret), ToolError> {
        check_length("url", &request.url, MAX_URL_BYTES)?;
        if let Some(description) = &request.description {
            check_length("description", description, MAX_DESCRIPTION_BYTES)?;
        }
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
        // Replicas each hold their own lock: together they may pass the bound by one each.
        let _creating = self.creating.lock().await;
        let made = self
            .store
            .subscriptions()
            .await
            .map_err(|error| unavailable(&error))?
            .len();
        if made >= settings.max_subscriptions {
            return Err(limit_reached(settings.max_subscriptions));
        }
        self.store
            .save_subscription(&stored)
            .await
            .map_err(|error| unavailable(&error))?;
        self.forget_subscriptions();
        Ok((SubscriptionView::from(&stored), secret))
    }

    /// A page of the subscriptions: those the file declares, in its order, then the store's,
    /// oldest first (by id: ids sort by time), with the cursor of the next page when there is
    /// one. A page goes on after its cursor's subscription even once it is gone.
    pub(crate) async fn list(
        &self,
        settings: &EventPolicy,
        page: &Page,
    ) -> Result<(Vec<SubscriptionView>, Option<Arc<str>>), ToolError> {
        let mut stored = self
            .store
            .subscriptions()
            .await
            .map_err(|error| unavailable(&error))?;
        stored.sort_unstable_by(|one, other| one.id.cmp(&other.id));
        let declared = &settings.declared;
        let start = match page.after.as_deref() {
            None => 0,
            Some(after) => match declared.iter().position(|declared| &*declared.id == after) {
                Some(index) => index + 1,
                // A declared one a reload removed: the store's come next.
                None if after.starts_with(DECLARED_PREFIX) => declared.len(),
                None => declared.len() + stored.partition_point(|one| &*one.id <= after),
            },
        };
        let total = declared.len() + stored.len();
        let end = start.saturating_add(page.limit).min(total);
        let views: Vec<SubscriptionView> = (start..end)
            .map(|index| match declared.get(index) {
                Some(declared) => declared_view(declared),
                None => SubscriptionView::from(&stored[index - declared.len()]),
            })
            .collect();
        let next = views
            .last()
            .filter(|_| end < total)
            .map(|last| Arc::clone(&last.id));
        Ok((views, next))
    }

    pub(crate) async fn get(
        &self,
        settings: &EventPolicy,
        id: &str,
    ) -> Result<SubscriptionView, ToolError> {
        if let Some(declared) = settings.declared(id) {
            return Ok(declared_view(declared));
        }
        Ok(SubscriptionView::from(&self.stored(id).await?))
    }

    pub(crate) async fn delete(&self, settings: &EventPolicy, id: &str) -> Result<(), ToolError> {
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
        settings: &EventPolicy,
        id: &str,
        change: SubscriptionChange,
    ) -> Result<SubscriptionView, ToolError> {
        refuse_declared(settings, id)?;
        let mut stored = self.stored(id).await?;
        if let Some(event_types) = change.event_types {
            stored.event_types = checked_event_types(event_types)?;
        }
        if let Some(description) = change.description {
            if let Some(description) = &description {
                check_length("description", description, MAX_DESCRIPTION_BYTES)?;
            }
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
        settings: &EventPolicy,
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
        settings: &EventPolicy,
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

fn declared_view(declared: &super::policy::DeclaredSubscription) -> SubscriptionView {
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
            let reason = format!("unknown event type `{}`", clip(&name));
            return Err(invalid(&reason).details(json!({ "reason": reason, "known": known })));
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

/// `400 INVALID_REQUEST` for a `field` longer than `limit` bytes, naming both.
fn check_length(field: &str, value: &str, limit: usize) -> Result<(), ToolError> {
    if value.len() <= limit {
        return Ok(());
    }
    let reason = format!("`{field}` is longer than {limit} bytes");
    Err(invalid(&reason).details(json!({
        "reason": reason,
        "field": field,
        "limit_bytes": limit,
    })))
}

/// `409 SUBSCRIPTION_LIMIT_REACHED`: as many subscriptions as the server keeps.
fn limit_reached(limit: usize) -> ToolError {
    let reason = format!(
        "there are already {limit} subscriptions, the most this server keeps ([events] \
         max_subscriptions): delete one first"
    );
    ToolError::conflict(codes::SUBSCRIPTION_LIMIT_REACHED, reason.clone())
        .recoverable(false)
        .details(json!({ "reason": reason, "limit": limit }))
}

fn refuse_declared(settings: &EventPolicy, id: &str) -> Result<(), ToolError> {
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

pub(crate) fn unavailable(error: &crate::store::StoreError) -> ToolError {
    tracing::error!(%error, "the event store failed");
    ToolError::capacity(codes::EVENTS_UNAVAILABLE, "the event store is unavailable")
        .retryable(Duration::from_secs(1))
}

/// A lock held only for plain assignments: a panic elsewhere leaves its value consistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Now, to the millisecond the stores keep.
pub(crate) fn now_millis() -> SystemTime {
    let since = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    SystemTime::UNIX_EPOCH
        + Duration::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}
