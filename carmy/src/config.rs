//! `carmy.toml`: who may call (tokens), how much (rate limits), and from where (CORS,
//! forwarding), with `CARMY_*` environment variables overriding the file.
//!
//! ```toml
//! trust_forwarded_for = false     # CARMY_TRUST_FORWARDED_FOR
//! security_headers = true         # CARMY_SECURITY_HEADERS
//!
//! [cors]
//! allowed_origins = ["https://app.example.com"]   # CARMY_CORS_ALLOWED_ORIGINS (comma-separated)
//!
//! [rate_limit]
//! window_secs = 60                # CARMY_RATE_LIMIT_WINDOW_SECS
//! anonymous = 30                  # CARMY_RATE_LIMIT_ANONYMOUS; a level left out is unlimited
//! known = 600                     # CARMY_RATE_LIMIT_KNOWN
//!
//! [server]                        # CARMY_SERVER_HEAD_TIMEOUT_SECS…
//! head_timeout_secs = 10          # at most 15
//! body_timeout_secs = 30          # at most 30
//! idle_timeout_secs = 60          # at most 75
//! max_connections = 10000         # default: 3/4 of the file-descriptor limit
//! shutdown_grace_secs = 10
//! drain_delay_secs = 5            # readiness fails this long before the listener closes
//!
//! [tools.cancel_order]            # per-tool overrides; tables have no CARMY_* override
//! enabled = false                 # hidden from the catalog and refused as unknown
//! [tools.sales_summary]
//! access = "anonymous"            # anonymous | known | partner | internal
//! timeout = "45s"
//! [metrics]
//! enabled = true                  # CARMY_METRICS_ENABLED: serve GET /metrics
//! trust = "internal"              # the least trusted caller that may read it (default anonymous)
//!
//! [events]                        # outbound webhooks (feature `events`): on when present
//! allow_http = false              # CARMY_EVENTS_ALLOW_HTTP: plain http:// receivers
//! allow_networks = []             # CARMY_EVENTS_ALLOW_NETWORKS: CIDRs exempt from the SSRF guard
//! retry_schedule = ["5s", "5m", "30m", "2h", "5h", "10h", "10h"]
//! disable_after = "5d"            # a subscription failing this long is disabled
//! attempt_timeout = "15s"
//! max_subscriptions = 100         # made through the API; more are refused with 409
//! max_pending_deliveries = 100000 # the outbox's bound: beyond it new events are dropped
//! [[events.subscriptions]]        # declared subscriptions, reloaded like the rest
//! url = "https://hooks.example.com/carmy"
//! event_types = ["execution.finished"]
//! secret_env = "SHOP_WEBHOOK_SECRET"   # names the variable holding its whsec_… secret
//!
//! [[tokens]]                      # tables of tokens have no override
//! id = "reporting"
//! trust = "known"
//! hash = "sha256:…"               # carmy::auth::hash_token, or printf %s "$TOKEN" | sha256sum
//! permissions = ["confirm:cancel_order"]
//! ```
//!
//! One `serde` struct per table, each refusing unknown keys, so a typo or a value of the wrong
//! type (`"true"` for a bool) stops the start with the file and line. Everything but the
//! `[server]` keys and `[metrics] enabled` is reloaded while serving (`crate::reload`); a change
//! to one of those needs a restart.

use std::collections::BTreeMap;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};
use toml::Spanned;

use crate::auth::TokenAuthenticator;
use crate::context::{Principal, TrustLevel};
use crate::error::Error;
use crate::protection::RateLimit;
use crate::serve::ServerConfig;

/// The variable that names the configuration file (default `./carmy.toml`, when present).
pub const CONFIG_PATH_VAR: &str = "CARMY_CONFIG";
const DEFAULT_PATH: &str = "carmy.toml";
const DEFAULT_WINDOW_SECS: NonZeroU64 = NonZeroU64::new(60).expect("60 is not zero");

/// The settings of `carmy.toml`, applied with [`App::config`](crate::App::config). Two equal
/// configurations serve alike: reloading an unchanged file changes nothing.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Config {
    pub(crate) authenticator: Option<TokenAuthenticator>,
    pub(crate) limits: [Option<RateLimit>; 4],
    pub(crate) trust_forwarded_for: bool,
    pub(crate) cors_origins: Vec<String>,
    pub(crate) security_headers: bool,
    pub(crate) server: ServerConfig,
    /// `[tools.NAME]`, by tool name.
    pub(crate) tools: BTreeMap<String, ToolOverride>,
    pub(crate) metrics: Metrics,
    /// `[events]`; `None` without the table: no events.
    pub(crate) events: Option<EventsConfig>,
}

/// `[events]`: how events are delivered, and the subscriptions the file declares.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct EventsConfig {
    pub(crate) allow_http: bool,
    pub(crate) allow_networks: Vec<String>,
    pub(crate) retry_schedule: Vec<Duration>,
    pub(crate) disable_after: Duration,
    pub(crate) attempt_timeout: Duration,
    /// The most subscriptions the API keeps (those declared in the file aside).
    pub(crate) max_subscriptions: usize,
    /// The most deliveries the outbox holds; an event beyond it is dropped.
    pub(crate) max_pending_deliveries: usize,
    pub(crate) subscriptions: Vec<DeclaredSubscriptionConfig>,
}

/// `[[events.subscriptions]]`, its secret read from the variable it names.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct DeclaredSubscriptionConfig {
    pub(crate) url: String,
    pub(crate) event_types: Vec<String>,
    pub(crate) secret: crate::events::secret::SigningSecret,
}

/// `[tools.NAME]`: what the file changes about one tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolOverride {
    pub(crate) enabled: bool,
    pub(crate) access: Option<TrustLevel>,
    pub(crate) timeout: Option<Duration>,
    /// `file:line` of the table, for the error when no tool has its name.
    pub(crate) location: String,
}

/// `[metrics]`: whether `/metrics` is served, and to whom; what is set replaces the builder's.
/// `enabled` is restart-only (the route and its middleware are set up once); `trust` reloads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct Metrics {
    pub(crate) enabled: Option<bool>,
    #[serde(deserialize_with = "some_trust_level")]
    pub(crate) trust: Option<TrustLevel>,
}

impl Config {
    /// The first restart-only key (`[server]`: the listener and connections are set up once;
    /// `[metrics] enabled`: the route and its middleware too) whose value differs in `next`.
    pub(crate) fn restart_required(&self, next: &Config) -> Option<&'static str> {
        let ServerConfig {
            head_timeout,
            body_timeout,
            idle_timeout,
            max_connections,
            shutdown_grace,
            drain_delay,
        } = self.server;
        let next_server = &next.server;
        [
            (
                "server.head_timeout_secs",
                head_timeout == next_server.head_timeout,
            ),
            (
                "server.body_timeout_secs",
                body_timeout == next_server.body_timeout,
            ),
            (
                "server.idle_timeout_secs",
                idle_timeout == next_server.idle_timeout,
            ),
            (
                "server.max_connections",
                max_connections == next_server.max_connections,
            ),
            (
                "server.shutdown_grace_secs",
                shutdown_grace == next_server.shutdown_grace,
            ),
            (
                "server.drain_delay_secs",
                drain_delay == next_server.drain_delay,
            ),
            (
                "metrics.enabled",
                self.metrics.enabled == next.metrics.enabled,
            ),
        ]
        .into_iter()
        .find(|&(_, same)| !same)
        .map(|(key, _)| key)
    }
}

impl Config {
    /// Reads the file named by `CARMY_CONFIG`, else `./carmy.toml` if it exists, else starts
    /// empty; then applies the `CARMY_*` overrides.
    pub fn load() -> Result<Self, Error> {
        match default_path() {
            Some(path) => Self::load_from(&path),
            None => Self::parse("", env_var),
        }
    }

    /// Reads the file at `path`, then applies the `CARMY_*` overrides. Errors name the file and
    /// the line.
    ///
    /// The file must be a regular file (after following symlinks, as a Kubernetes ConfigMap
    /// mounts it) of at most [`MAX_FILE_BYTES`]; anything else is refused without reading it
    /// whole.
    pub fn load_from(path: &Path) -> Result<Self, Error> {
        let text = read_bounded(path)?;
        Self::parse_file(&path.display().to_string(), &text, env_var)
    }

    /// Parses a `carmy.toml`, with overrides looked up by `env` (`CARMY_RATE_LIMIT_KNOWN`…).
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        Self::parse_file(DEFAULT_PATH, text, env)
    }

    /// Errors quote the file (TOML's quotes the whole line at fault): they are clipped, as
    /// they are shown in health, in the reload's answer and in logs.
    fn parse_file(
        origin: &str,
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Error> {
        Self::parse_unclipped(origin, text, env).map_err(clipped)
    }

    fn parse_unclipped(
        origin: &str,
        text: &str,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Error> {
        let mut file: File =
            toml::from_str(text).map_err(|error| Error::Config(format!("{origin}: {error}")))?;
        for (key, set) in OVERRIDES {
            let name = env_name(key);
            if let Some(value) = env(&name) {
                set(&mut file, &value).map_err(|expected| {
                    Error::Config(format!(
                        "`{name}` (`{key}`) must be {expected}, not `{value}`"
                    ))
                })?;
            }
        }
        let at = |span: &Range<usize>| format!("{origin}:{}", line(text, span));
        file.into_config(at, &env)
            .map_err(|(error, span)| Error::Config(format!("{}: {error}", at(&span))))
    }
}

/// The most a configuration file may hold, in bytes (1 MiB): a `carmy.toml` is a few
/// kilobytes, and reading a larger one (or a device behind a symlink) would only fill memory.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// The text of the file at `path`: a regular file of at most [`MAX_FILE_BYTES`], never read
/// past that.
fn read_bounded(path: &Path) -> Result<String, Error> {
    use std::io::Read as _;
    let refused = |why: &dyn std::fmt::Display| {
        Error::Config(clip_error(&format!(
            "cannot read {}: {why}",
            path.display()
        )))
    };
    let too_large = || {
        refused(&format_args!(
            "it is larger than {MAX_FILE_BYTES} bytes, the most a configuration file may be"
        ))
    };
    // Looked at before opening (which follows symlinks too): opening a FIFO would wait for a
    // writer, and a device has no end.
    let metadata = std::fs::metadata(path).map_err(|error| refused(&error))?;
    if !metadata.is_file() {
        return Err(refused(&"it is not a regular file"));
    }
    if metadata.len() > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let file = std::fs::File::open(path).map_err(|error| refused(&error))?;
    // What was opened may not be what was looked at: the path can be replaced in between.
    let opened = file.metadata().map_err(|error| refused(&error))?;
    if !opened.is_file() {
        return Err(refused(&"it is not a regular file"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| refused(&error))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|_| refused(&"it is not UTF-8 text"))
}

/// How many lines of a configuration error are kept: TOML's are five (the message, the line at
/// fault, its caret).
const MAX_ERROR_LINES: usize = 12;

/// A configuration error as it is shown: each line cut to [`MAX_ECHO`](crate::tool_error::MAX_ECHO)
/// bytes, at most [`MAX_ERROR_LINES`] lines (a few KiB in all). TOML quotes the whole line at
/// fault, and a file may be a single line of a megabyte.
pub(crate) fn clip_error(message: &str) -> String {
    let mut lines = message.lines();
    let mut clipped = String::new();
    for (index, line) in lines.by_ref().take(MAX_ERROR_LINES).enumerate() {
        if index > 0 {
            clipped.push('\n');
        }
        clipped.push_str(&crate::tool_error::clip(line));
    }
    if lines.next().is_some() {
        clipped.push_str("\n…");
    }
    clipped
}

/// `error` with its configuration message clipped ([`clip_error`]).
pub(crate) fn clipped(error: Error) -> Error {
    match error {
        Error::Config(message) => Error::Config(clip_error(&message)),
        other => other,
    }
}

/// The file named by `CARMY_CONFIG`, else `./carmy.toml` if it exists.
pub(crate) fn default_path() -> Option<PathBuf> {
    match std::env::var_os(CONFIG_PATH_VAR) {
        Some(path) => Some(PathBuf::from(path)),
        None => Some(PathBuf::from(DEFAULT_PATH)).filter(|path| path.exists()),
    }
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// `rate_limit.known` is overridden by `CARMY_RATE_LIMIT_KNOWN`.
fn env_name(key: &str) -> String {
    format!("CARMY_{}", key.replace('.', "_").to_ascii_uppercase())
}

/// The 1-based line of a byte offset, for errors found after parsing.
fn line(text: &str, span: &Range<usize>) -> usize {
    text.get(..span.start)
        .map_or(0, |before| before.matches('\n').count() + 1)
}

/// The file as written: one struct per table, unknown keys refused by serde (with their line).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct File {
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

fn some_trust_level<'de, D: Deserializer<'de>>(
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
type Override = fn(&mut File, &str) -> Result<(), &'static str>;

/// Every scalar key and its override (lists are comma-separated). A new key adds a line.
const OVERRIDES: &[(&str, Override)] = &[
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

fn set<T: FromEnv>(slot: &mut T, value: &str) -> Result<(), &'static str> {
    *slot = T::from_env(value.trim())?;
    Ok(())
}

/// A value read from a `CARMY_*` variable.
trait FromEnv: Sized {
    /// The value, or what it must be.
    fn from_env(text: &str) -> Result<Self, &'static str>;
}

macro_rules! from_env_by_parse {
    ($($ty:ty => $expected:literal),* $(,)?) => {
        $(
            impl FromEnv for $ty {
                fn from_env(text: &str) -> Result<Self, &'static str> {
                    text.parse().map_err(|_| $expected)
                }
            }
        )*
    };
}

from_env_by_parse! {
    bool => "`true` or `false`",
    NonZeroU32 => "a number from 1",
    NonZeroU64 => "a number from 1",
    u64 => "a whole number",
}

impl<T: FromEnv> FromEnv for Option<T> {
    fn from_env(text: &str) -> Result<Self, &'static str> {
        T::from_env(text).map(Some)
    }
}

impl FromEnv for Vec<String> {
    fn from_env(text: &str) -> Result<Self, &'static str> {
        Ok(text
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(str::to_owned)
            .collect())
    }
}

impl File {
    /// The settings, or an error and the span of the value at fault; `at` names a span's
    /// `file:line`.
    fn into_config(
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
                    crate::events::secret::SigningSecret::parse(text.trim()).map_err(|error| {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, |_| None).map_err(|error| error.to_string())
    }

    #[test]
    fn server_limits() {
        let config = Config::parse(
            "[server]\nhead_timeout_secs = 5\nmax_connections = 100\n",
            |name| (name == "CARMY_SERVER_BODY_TIMEOUT_SECS").then(|| "20".to_owned()),
        )
        .unwrap();
        assert_eq!(config.server.head_timeout, Some(Duration::from_secs(5)));
        assert_eq!(config.server.body_timeout, Some(Duration::from_secs(20)));
        assert_eq!(config.server.idle_timeout, None);
        assert_eq!(config.server.max_connections, Some(100));
        let error = parse("[server]\nhead_timeout = 5\n").unwrap_err();
        assert!(error.contains("unknown field `head_timeout`"), "{error}");
    }

    #[test]
    fn the_event_bounds_default_and_are_at_least_one() {
        let events = |text: &str| parse(text).map(|config| config.events.unwrap());
        let defaults = events("[events]\n").unwrap();
        assert_eq!(defaults.max_subscriptions, 100);
        assert_eq!(defaults.max_pending_deliveries, 100_000);
        let set = events("[events]\nmax_subscriptions = 3\nmax_pending_deliveries = 7\n").unwrap();
        assert_eq!((set.max_subscriptions, set.max_pending_deliveries), (3, 7));
        for key in ["max_subscriptions", "max_pending_deliveries"] {
            let error = events(&format!("[events]\n{key} = 0\n")).unwrap_err();
            assert!(error.contains("line 2"), "{error}");
        }
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let error = parse("[rate_limit]\nanonymus = 3\n").unwrap_err();
        assert!(error.contains("line 2"), "{error}");
        assert!(error.contains("unknown field `anonymus`"), "{error}");
        assert!(error.contains("`anonymous`"), "{error}");
        let error = parse("colour = 1\n").unwrap_err();
        assert!(error.contains("unknown field `colour`"), "{error}");
        let hash = crate::auth::hash_token("t");
        let error = parse(&format!(
            "[[tokens]]\nid = \"a\"\nhash = \"{hash}\"\nrole = \"x\"\n"
        ))
        .unwrap_err();
        assert!(error.contains("line 4"), "{error}");
        assert!(error.contains("unknown field `role`"), "{error}");
    }

    #[test]
    fn tool_overrides() {
        let config = parse(
            "[tools.a]\nenabled = false\n\n[tools.b]\naccess = \"anonymous\"\ntimeout = \"1m 30s\"\n",
        )
        .unwrap();
        assert_eq!(
            config.tools["a"],
            ToolOverride {
                enabled: false,
                access: None,
                timeout: None,
                location: "carmy.toml:1".to_owned(),
            }
        );
        assert_eq!(config.tools["b"].access, Some(TrustLevel::Anonymous));
        assert_eq!(config.tools["b"].timeout, Some(Duration::from_secs(90)));
        assert_eq!(config.tools["b"].location, "carmy.toml:4");
        for (text, expected) in [
            (
                "[tools.a]\ntimeout = \"soon\"\n",
                "`soon` is not a duration",
            ),
            ("[tools.a]\ntimeout = \"0s\"\n", "at least 1ms"),
            ("[tools.a]\ntimeout = 30\n", "line 2"),
            ("[tools.a]\naccess = \"root\"\n", "`partner`"),
            ("[tools.a]\nhidden = true\n", "unknown field `hidden`"),
        ] {
            let error = parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn only_server_keys_and_metrics_enabled_need_a_restart() {
        let before = parse("[server]\nhead_timeout_secs = 5\n").unwrap();
        let tokens = parse(
            "security_headers = true\n[rate_limit]\nknown = 3\n[server]\nhead_timeout_secs = 5\n",
        )
        .unwrap();
        assert_eq!(before.restart_required(&tokens), None);
        let dropped = parse("").unwrap();
        assert_eq!(
            before.restart_required(&dropped),
            Some("server.head_timeout_secs")
        );
        let grace = parse("[server]\nhead_timeout_secs = 5\nshutdown_grace_secs = 3\n").unwrap();
        assert_eq!(
            before.restart_required(&grace),
            Some("server.shutdown_grace_secs")
        );
        let server = "[server]\nhead_timeout_secs = 5\n";
        let trust = parse(&format!("{server}[metrics]\ntrust = \"internal\"\n")).unwrap();
        assert_eq!(before.restart_required(&trust), None);
        let enabled = parse(&format!("{server}[metrics]\nenabled = true\n")).unwrap();
        assert_eq!(before.restart_required(&enabled), Some("metrics.enabled"));
    }

    #[test]
    fn rate_limits_per_level() {
        let config = parse("[rate_limit]\nwindow_secs = 10\nknown = 5\n").unwrap();
        assert_eq!(config.limits[TrustLevel::Anonymous.index()], None);
        assert_eq!(
            config.limits[TrustLevel::Known.index()],
            Some(RateLimit {
                requests: 5,
                window: Duration::from_secs(10)
            })
        );
        assert!(parse("[rate_limit]\nknown = 0\n").is_err());
        assert!(parse("[rate_limit]\nknown = \"5\"\n").is_err());
        assert!(parse("[rate_limit]\nwindow_secs = 0\n").is_err());
    }

    #[test]
    fn environment_overrides_the_file() {
        let config = Config::parse("[rate_limit]\nknown = 5\n", |name| match name {
            "CARMY_RATE_LIMIT_KNOWN" => Some("7".to_owned()),
            "CARMY_CORS_ALLOWED_ORIGINS" => Some("https://a.example, https://b.example".to_owned()),
            "CARMY_SECURITY_HEADERS" => Some("true".to_owned()),
            _ => None,
        })
        .unwrap();
        assert_eq!(
            config.limits[TrustLevel::Known.index()].unwrap().requests,
            7
        );
        assert_eq!(
            config.cors_origins,
            ["https://a.example", "https://b.example"]
        );
        assert!(config.security_headers);
        let error = Config::parse("", |name| {
            (name == "CARMY_RATE_LIMIT_KNOWN").then(|| "lots".to_owned())
        })
        .unwrap_err();
        assert!(
            error
                .to_string()
                .contains("`CARMY_RATE_LIMIT_KNOWN` (`rate_limit.known`) must be a number from 1"),
            "{error}"
        );
    }

    #[test]
    fn every_override_names_a_key_of_the_file() {
        for (key, _) in OVERRIDES {
            let text = match key.split_once('.') {
                Some((table, key)) => format!("[{table}]\n{key} = {{}}\n"),
                None => format!("{key} = {{}}\n"),
            };
            let error = toml::from_str::<File>(&text).unwrap_err().to_string();
            assert!(!error.contains("unknown field"), "{key}: {error}");
        }
    }

    #[test]
    fn a_token_may_not_take_the_id_of_anonymous_callers() {
        let hash = crate::auth::hash_token("t");
        for id in ["anonymous", "Anonymous", "ANONYMOUS", " anonymous "] {
            let error = parse(&format!(
                "[[tokens]]\ntrust = \"internal\"\nid = \"{id}\"\nhash = \"{hash}\"\n"
            ))
            .unwrap_err();
            assert!(error.contains("reserved"), "{id}: {error}");
            assert!(error.contains("carmy.toml:3:"), "{id}: {error}");
        }
        for id in ["anonymous-bot", "anon", "reporting"] {
            let text = format!("[[tokens]]\nid = \"{id}\"\nhash = \"{hash}\"\n");
            assert!(parse(&text).is_ok(), "{id}");
        }
    }

    #[test]
    fn tokens_are_stored_as_digests_only() {
        let error = parse("[[tokens]]\nid = \"a\"\nhash = \"plain-token\"\n").unwrap_err();
        assert!(error.contains("sha256:"), "{error}");
        assert!(error.contains("carmy.toml:3:"), "{error}");
        let error = parse("[[tokens]]\nhash = \"x\"\n").unwrap_err();
        assert!(error.contains("missing field `id`"), "{error}");
        let error = parse("[[tokens]]\nid = \"a\"\ntrust = \"admin\"\nhash = \"x\"\n").unwrap_err();
        assert!(error.contains("unknown variant `admin`"), "{error}");
    }
}
