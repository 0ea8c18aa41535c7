//! The file as written: one `serde` struct per table, each refusing unknown keys, the
//! `CARMY_*` overrides of its scalar keys, and the settings it amounts to.

use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::ops::Range;
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use super::env::set;
use super::{
    Config, DeclaredSubscriptionConfig, EventsConfig, Metrics, ServerConfig, ToolOverride,
};
use crate::auth::TokenAuthenticator;
use crate::error::Error;
use crate::principal::{Principal, TrustLevel};
use crate::protection::RateLimit;

const DEFAULT_WINDOW_SECS: NonZeroU64 = NonZeroU64::new(60).expect("60 is not zero");

/// The file as written: one struct per table, unknown keys refused by serde (with their line).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(super) struct File {
    trust_forwarded_for: bool,
    security_headers: bool,
    cors: Cors,
    rate_limit: RateLimits,
    server: Server,
    metrics: Metrics,
    /// `None` without a `[[tokens]]` table: no token authentication at all.
    tokens: Option<Vec<Token>>,
    tools: BTreeMap<String, Spanned<Tool>>,
    events: Option<Events>,
}

/// `[events]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Events {
    #[serde(default)]
    allow_http: bool,
    #[serde(default)]
    allow_networks: Vec<String>,
    #[serde(default = "retry_schedule", deserialize_with = "durations")]
    retry_schedule: Vec<Duration>,
    #[serde(default = "disable_after", deserialize_with = "duration")]
    disable_after: Duration,
    #[serde(default = "attempt_timeout", deserialize_with = "duration")]
    attempt_timeout: Duration,
    #[serde(default = "max_subscriptions")]
    max_subscriptions: NonZeroUsize,
    #[serde(default = "max_pending_deliveries")]
    max_pending_deliveries: NonZeroUsize,
    #[serde(default)]
    subscriptions: Vec<Spanned<DeclaredSubscription>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclaredSubscription {
    url: String,
    event_types: Vec<String>,
    secret_env: String,
}

fn retry_schedule() -> Vec<Duration> {
    ["5s", "5m", "30m", "2h", "5h", "10h", "10h"]
        .iter()
        .filter_map(|text| humantime::parse_duration(text).ok())
        .collect()
}

fn disable_after() -> Duration {
    Duration::from_secs(5 * 24 * 60 * 60)
}

fn attempt_timeout() -> Duration {
    Duration::from_secs(15)
}

fn max_subscriptions() -> NonZeroUsize {
    NonZeroUsize::new(100).expect("100 is not zero")
}

fn max_pending_deliveries() -> NonZeroUsize {
    NonZeroUsize::new(100_000).expect("100,000 is not zero")
}

/// `"15s"`, in humantime's notation, at least a millisecond.
fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    timeout(deserializer)?.ok_or_else(|| serde::de::Error::custom("a duration is required"))
}

/// `["5s", "5m"]`, each at least a millisecond.
fn durations<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Duration>, D::Error> {
    Vec::<String>::deserialize(deserializer)?
        .iter()
        .map(|text| match humantime::parse_duration(text) {
            Ok(duration) if duration >= Duration::from_millis(1) => Ok(duration),
            Ok(_) => Err(serde::de::Error::custom("a delay must be at least 1ms")),
            Err(error) => Err(serde::de::Error::custom(format!(
                "`{text}` is not a duration such as \"5s\": {error}"
            ))),
        })
        .collect()
}

/// `[tools.NAME]`: a tool turned off, opened or closed to a trust level, or given a deadline.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tool {
    #[serde(default = "enabled")]
    enabled: bool,
    #[serde(default, deserialize_with = "some_trust_level")]
    access: Option<TrustLevel>,
    #[serde(default, deserialize_with = "timeout")]
    timeout: Option<Duration>,
}

fn enabled() -> bool {
    true
}

pub(super) fn some_trust_level<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<TrustLevel>, D::Error> {
    trust_level(deserializer).map(Some)
}

/// `timeout = "30s"`, in humantime's notation, at least a millisecond.
fn timeout<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(deserializer)?;
    match humantime::parse_duration(&text) {
        Ok(duration) if duration >= Duration::from_millis(1) => Ok(Some(duration)),
        Ok(_) => Err(serde::de::Error::custom("a timeout must be at least 1ms")),
        Err(error) => Err(serde::de::Error::custom(format!(
            "`{text}` is not a duration such as \"30s\": {error}"
        ))),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Cors {
    allowed_origins: Vec<String>,
}

/// Requests per window for each trust level; a level left out is unlimited.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RateLimits {
    window_secs: NonZeroU64,
    anonymous: Option<NonZeroU32>,
    known: Option<NonZeroU32>,
    partner: Option<NonZeroU32>,
    internal: Option<NonZeroU32>,
}

impl Default for RateLimits {
    fn default() -> Self {
        RateLimits {
            window_secs: DEFAULT_WINDOW_SECS,
            anonymous: None,
            known: None,
            partner: None,
            internal: None,
        }
    }
}

/// Connection limits and shutdown; what is set replaces the builder's value.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Server {
    head_timeout_secs: Option<NonZeroU64>,
    body_timeout_secs: Option<NonZeroU64>,
    idle_timeout_secs: Option<NonZeroU64>,
    max_connections: Option<NonZeroU64>,
    shutdown_grace_secs: Option<u64>,
    drain_delay_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Token {
    id: Spanned<String>,
    #[serde(default = "known", deserialize_with = "trust_level")]
    trust: TrustLevel,
    hash: Spanned<String>,
    #[serde(default)]
    permissions: Vec<String>,
}

fn known() -> TrustLevel {
    TrustLevel::Known
}

fn trust_level<'de, D: Deserializer<'de>>(deserializer: D) -> Result<TrustLevel, D::Error> {
    const NAMES: &[&str] = &[
        TrustLevel::Anonymous.as_str(),
        TrustLevel::Known.as_str(),
        TrustLevel::Partner.as_str(),
        TrustLevel::Internal.as_str(),
    ];
    let name = String::deserialize(deserializer)?;
    TrustLevel::from_name(&name).ok_or_else(|| serde::de::Error::unknown_variant(&name, NAMES))
}

/// Sets one key from its `CARMY_*` variable; `Err` says what the value must be.
pub(super) type Override = fn(&mut File, &str) -> Result<(), &'static str>;

/// Every scalar key and its override (lists are comma-separated). A new key adds a line.
pub(super) const OVERRIDES: &[(&str, Override)] = &[
    ("trust_forwarded_for", |file, value| {
        set(&mut file.trust_forwarded_for, value)
    }),
    ("security_headers", |file, value| {
        set(&mut file.security_headers, value)
    }),
    ("cors.allowed_origins", |file, value| {
        set(&mut file.cors.allowed_origins, value)
    }),
    ("rate_limit.window_secs", |file, value| {
        set(&mut file.rate_limit.window_secs, value)
    }),
    ("rate_limit.anonymous", |file, value| {
        set(&mut file.rate_limit.anonymous, value)
    }),
    ("rate_limit.known", |file, value| {
        set(&mut file.rate_limit.known, value)
    }),
    ("rate_limit.partner", |file, value| {
        set(&mut file.rate_limit.partner, value)
    }),
    ("rate_limit.internal", |file, value| {
        set(&mut file.rate_limit.internal, value)
    }),
    ("server.head_timeout_secs", |file, value| {
        set(&mut file.server.head_timeout_secs, value)
    }),
    ("server.body_timeout_secs", |file, value| {
        set(&mut file.server.body_timeout_secs, value)
    }),
    ("server.idle_timeout_secs", |file, value| {
        set(&mut file.server.idle_timeout_secs, value)
    }),
    ("server.max_connections", |file, value| {
        set(&mut file.server.max_connections, value)
    }),
    ("server.shutdown_grace_secs", |file, value| {
        set(&mut file.server.shutdown_grace_secs, value)
    }),
    ("server.drain_delay_secs", |file, value| {
        set(&mut file.server.drain_delay_secs, value)
    }),
    ("metrics.enabled", |file, value| {
        set(&mut file.metrics.enabled, value)
    }),
    ("events.allow_http", |file, value| match &mut file.events {
        Some(events) => set(&mut events.allow_http, value),
        None => Err(NO_EVENTS_TABLE),
    }),
    ("events.allow_networks", |file, value| {
        match &mut file.events {
            Some(events) => set(&mut events.allow_networks, value),
            None => Err(NO_EVENTS_TABLE),
        }
    }),
];

/// Events are turned on in the file; an override only changes how.
const NO_EVENTS_TABLE: &str = "set in a file with an `[events]` table";

impl File {
    /// The settings, or an error and the span of the value at fault; `at` names a span's
    /// `file:line`.
    pub(super) fn into_config(
        self,
        at: impl Fn(&Range<usize>) -> String,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, (Error, Range<usize>)> {
        let File {
            trust_forwarded_for,
            security_headers,
            cors: Cors { allowed_origins },
            rate_limit,
            server,
            metrics,
            tokens,
            tools,
            events,
        } = self;
        let events = events.map(|events| events.into_config(&env)).transpose()?;
        let tools = tools
            .into_iter()
            .map(|(name, tool)| {
                let location = at(&tool.span());
                let Tool {
                    enabled,
                    access,
                    timeout,
                } = tool.into_inner();
                let tool = ToolOverride {
                    enabled,
                    access,
                    timeout,
                    location,
                };
                (name, tool)
            })
            .collect();
        let RateLimits {
            window_secs,
            anonymous,
            known,
            partner,
            internal,
        } = rate_limit;
        let window = Duration::from_secs(window_secs.get());
        let limits = [anonymous, known, partner, internal].map(|requests| {
            requests.map(|requests| RateLimit {
                requests: requests.get(),
                window,
            })
        });
        let authenticator = match tokens {
            None => None,
            Some(tokens) => Some(tokens.into_iter().try_fold(
                TokenAuthenticator::new(),
                |authenticator, token| {
                    let Token {
                        id,
                        trust,
                        hash,
                        permissions,
                    } = token;
                    let id_span = id.span();
                    let principal = permissions.into_iter().fold(
                        Principal::new(id.into_inner(), trust),
                        Principal::with_permission,
                    );
                    authenticator
                        .token(hash.get_ref(), principal)
                        .map_err(|error| match error {
                            Error::ReservedTokenId { .. } => (error, id_span),
                            error => (error, hash.span()),
                        })
                },
            )?),
        };
        Ok(Config {
            authenticator,
            limits,
            trust_forwarded_for,
            cors_origins: allowed_origins,
            security_headers,
            server: server.into_config(),
            tools,
            metrics,
            events,
        })
    }
}

impl Events {
    /// The settings, each declared subscription's secret read from its variable.
    fn into_config(
        self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<EventsConfig, (Error, Range<usize>)> {
        let Events {
            allow_http,
            allow_networks,
            retry_schedule,
            disable_after,
            attempt_timeout,
            max_subscriptions,
            max_pending_deliveries,
            subscriptions,
        } = self;
        let subscriptions = subscriptions
            .into_iter()
            .map(|declared| {
                let span = declared.span();
                let DeclaredSubscription {
                    url,
                    event_types,
                    secret_env,
                } = declared.into_inner();
                let refused = |reason: String| (Error::Config(reason), span.clone());
                let text = env(&secret_env).ok_or_else(|| {
                    refused(format!(
                        "the secret of {url}: the variable `{secret_env}` is not set"
                    ))
                })?;
                let secret =
                    crate::webhook::SigningSecret::parse(text.trim()).map_err(|error| {
                        refused(format!("the secret of {url} in `{secret_env}`: {error}"))
                    })?;
                Ok(DeclaredSubscriptionConfig {
                    url,
                    event_types,
                    secret,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(EventsConfig {
            allow_http,
            allow_networks,
            retry_schedule,
            disable_after,
            attempt_timeout,
            max_subscriptions: max_subscriptions.get(),
            max_pending_deliveries: max_pending_deliveries.get(),
            subscriptions,
        })
    }
}

impl Server {
    fn into_config(self) -> ServerConfig {
        let Server {
            head_timeout_secs,
            body_timeout_secs,
            idle_timeout_secs,
            max_connections,
            shutdown_grace_secs,
            drain_delay_secs,
        } = self;
        let secs = |secs: Option<NonZeroU64>| secs.map(|secs| Duration::from_secs(secs.get()));
        ServerConfig {
            head_timeout: secs(head_timeout_secs),
            body_timeout: secs(body_timeout_secs),
            idle_timeout: secs(idle_timeout_secs),
            max_connections: max_connections
                .map(|count| usize::try_from(count.get()).unwrap_or(usize::MAX)),
            shutdown_grace: shutdown_grace_secs.map(Duration::from_secs),
            drain_delay: drain_delay_secs.map(Duration::from_secs),
        }
    }
}
