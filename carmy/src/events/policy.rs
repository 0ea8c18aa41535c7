//! `[events]` in force: how deliveries are made and retried, and the subscriptions the file
//! declares. Part of the configuration snapshot, so a reload changes them whole.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::config::EventsConfig;
use crate::error::Error;
use crate::webhook::{AllowedNetworks, Deliverer, DeliveryPolicy, SigningSecret};

/// The event types carmy emits (`protocol.md` §8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum EventType {
    ExecutionFinished,
    HealthChanged,
    ToolsChanged,
    SubscriptionDisabled,
}

impl EventType {
    pub(crate) const ALL: [EventType; 4] = [
        EventType::ExecutionFinished,
        EventType::HealthChanged,
        EventType::ToolsChanged,
        EventType::SubscriptionDisabled,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            EventType::ExecutionFinished => "execution.finished",
            EventType::HealthChanged => "health.changed",
            EventType::ToolsChanged => "tools.changed",
            EventType::SubscriptionDisabled => "subscription.disabled",
        }
    }

    pub(crate) fn from_wire(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// How the id of a subscription declared in `carmy.toml` starts.
pub(crate) const DECLARED_PREFIX: &str = "sub_config_";

/// A subscription declared in `carmy.toml`: read-only through the API, the same on every
/// replica that reads the same file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeclaredSubscription {
    /// `sub_` + a digest of its URL and event types: stable across reloads and replicas.
    pub(crate) id: Arc<str>,
    pub(crate) url: String,
    pub(crate) event_types: Vec<EventType>,
    pub(crate) secret: SigningSecret,
}

/// The `[events]` table, with everything derived from it.
#[derive(Debug)]
pub(crate) struct EventPolicy {
    pub(crate) deliverer: Deliverer,
    /// How long one attempt may take.
    pub(crate) attempt_timeout: Duration,
    /// The delays before retries 1, 2, 3…; after the last, the delivery has failed.
    pub(crate) retry_schedule: Vec<Duration>,
    /// A subscription failing without a success for this long is disabled.
    pub(crate) disable_after: Duration,
    /// The most subscriptions made through the API.
    pub(crate) max_subscriptions: usize,
    /// The outbox's bound: beyond it new events are dropped (and said so in health), never the
    /// caller's answer delayed.
    pub(crate) max_pending_deliveries: usize,
    pub(crate) declared: Vec<DeclaredSubscription>,
}

impl EventPolicy {
    pub(crate) fn build(config: &EventsConfig) -> Result<Self, Error> {
        let allowed = AllowedNetworks::parse(&config.allow_networks)
            .map_err(|reason| Error::Config(format!("[events] allow_networks: {reason}")))?;
        let deliverer = Deliverer::new(DeliveryPolicy {
            allow_http: config.allow_http,
            allowed,
            attempt_timeout: config.attempt_timeout,
        });
        let declared = config
            .subscriptions
            .iter()
            .map(|declared| {
                let event_types = declared
                    .event_types
                    .iter()
                    .map(|name| {
                        EventType::from_wire(name).ok_or_else(|| {
                            Error::Config(format!(
                                "[[events.subscriptions]] {}: unknown event type `{name}`",
                                declared.url
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(DeclaredSubscription {
                    id: declared_id(&declared.url, &event_types),
                    url: declared.url.clone(),
                    event_types,
                    secret: declared.secret.clone(),
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(EventPolicy {
            deliverer,
            attempt_timeout: config.attempt_timeout,
            retry_schedule: config.retry_schedule.clone(),
            disable_after: config.disable_after,
            max_subscriptions: config.max_subscriptions,
            max_pending_deliveries: config.max_pending_deliveries,
            declared,
        })
    }

    pub(crate) fn declared(&self, id: &str) -> Option<&DeclaredSubscription> {
        self.declared.iter().find(|declared| &*declared.id == id)
    }
}

fn declared_id(url: &str, event_types: &[EventType]) -> Arc<str> {
    let mut digest = Sha256::new();
    digest.update(url.as_bytes());
    for kind in event_types {
        digest.update(b"\n");
        digest.update(kind.as_str().as_bytes());
    }
    let hex: String = digest.finalize()[..12]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    Arc::from(format!("{DECLARED_PREFIX}{hex}"))
}
