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

mod diff;
mod env;
mod file;
mod read;
mod server;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::auth::TokenAuthenticator;
use crate::error::Error;
use crate::principal::TrustLevel;
use crate::protection::RateLimit;
use env::{env_name, env_var};
use file::{File, OVERRIDES};
pub use read::MAX_FILE_BYTES;
pub(crate) use read::clipped;
use read::read_bounded;
pub(crate) use server::{
    MAX_BODY_TIMEOUT, MAX_HEAD_TIMEOUT, MAX_IDLE_TIMEOUT, ServerConfig, check_body_timeout,
    check_timeout,
};

/// The variable that names the configuration file (default `./carmy.toml`, when present).
pub const CONFIG_PATH_VAR: &str = "CARMY_CONFIG";
const DEFAULT_PATH: &str = "carmy.toml";

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
    pub(crate) secret: crate::webhook::SigningSecret,
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
    #[serde(deserialize_with = "file::some_trust_level")]
    pub(crate) trust: Option<TrustLevel>,
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

/// The file named by `CARMY_CONFIG`, else `./carmy.toml` if it exists.
pub(crate) fn default_path() -> Option<PathBuf> {
    match std::env::var_os(CONFIG_PATH_VAR) {
        Some(path) => Some(PathBuf::from(path)),
        None => Some(PathBuf::from(DEFAULT_PATH)).filter(|path| path.exists()),
    }
}

/// The 1-based line of a byte offset, for errors found after parsing.
fn line(text: &str, span: &Range<usize>) -> usize {
    text.get(..span.start)
        .map_or(0, |before| before.matches('\n').count() + 1)
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
