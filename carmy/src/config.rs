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
//! [server]                      # CARMY_SERVER_HEAD_TIMEOUT_SECS…
//! head_timeout_secs = 10          # at most 15
//! body_timeout_secs = 30          # at most 30
//! idle_timeout_secs = 60          # at most 75
//! max_connections = 10000         # default: 3/4 of the file-descriptor limit
//! shutdown_grace_secs = 10
//!
//! [[tokens]]
//! id = "reporting"
//! trust = "known"
//! hash = "sha256:…"               # carmy::auth::hash_token, or printf %s "$TOKEN" | sha256sum
//! permissions = ["confirm:cancel_order"]
//! ```

use std::path::Path;
use std::time::Duration;

use toml::{Table, Value};

use crate::auth::TokenAuthenticator;
use crate::context::{Principal, TrustLevel};
use crate::error::Error;
use crate::protection::RateLimit;
use crate::serve::ServerConfig;

/// The variable that names the configuration file (default `./carmy.toml`, when present).
pub const CONFIG_PATH_VAR: &str = "CARMY_CONFIG";
const DEFAULT_PATH: &str = "carmy.toml";
const DEFAULT_WINDOW_SECS: u64 = 60;

/// The settings of `carmy.toml`, applied with [`App::config`](crate::App::config).
#[derive(Debug, Default)]
pub struct Config {
    pub(crate) authenticator: Option<TokenAuthenticator>,
    pub(crate) limits: [Option<RateLimit>; 4],
    pub(crate) trust_forwarded_for: bool,
    pub(crate) cors_origins: Vec<String>,
    pub(crate) security_headers: bool,
    pub(crate) server: ServerConfig,
}

impl Config {
    /// Reads the file named by `CARMY_CONFIG`, else `./carmy.toml` if it exists, else starts
    /// empty; then applies the `CARMY_*` overrides.
    pub fn load() -> Result<Self, Error> {
        match std::env::var_os(CONFIG_PATH_VAR) {
            Some(path) => Self::load_from(Path::new(&path)),
            None if Path::new(DEFAULT_PATH).exists() => Self::load_from(Path::new(DEFAULT_PATH)),
            None => Self::parse("", env_var),
        }
    }

    /// Reads the file at `path`, then applies the `CARMY_*` overrides.
    pub fn load_from(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| Error::Config(format!("cannot read {}: {error}", path.display())))?;
        Self::parse(&text, env_var)
    }

    /// Parses a `carmy.toml`, with overrides looked up by `env` (`CARMY_RATE_LIMIT_KNOWN`…).
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let mut root: Table = text
            .parse()
            .map_err(|error: toml::de::Error| Error::Config(error.to_string()))?;
        for path in OVERRIDABLE {
            let name = format!("CARMY_{}", path.replace('.', "_").to_ascii_uppercase());
            if let Some(value) = env(&name) {
                set(&mut root, path, Value::String(value));
            }
        }
        Self::from_table(Section::root(root))
    }

    fn from_table(mut root: Section) -> Result<Self, Error> {
        let trust_forwarded_for = root.bool("trust_forwarded_for")?.unwrap_or(false);
        let security_headers = root.bool("security_headers")?.unwrap_or(false);
        let cors_origins = match root.section("cors")? {
            Some(mut cors) => {
                let origins = cors.strings("allowed_origins")?;
                cors.finish()?;
                origins
            }
            None => Vec::new(),
        };
        let mut limits = [None; 4];
        if let Some(mut rate_limit) = root.section("rate_limit")? {
            let window_secs = rate_limit
                .integer("window_secs")?
                .unwrap_or(DEFAULT_WINDOW_SECS);
            if window_secs == 0 {
                return Err(rate_limit.invalid("window_secs", "a positive number of seconds"));
            }
            for trust in TrustLevel::ALL {
                if let Some(requests) = rate_limit.integer(trust.as_str())? {
                    let requests = u32::try_from(requests)
                        .ok()
                        .filter(|&requests| requests > 0)
                        .ok_or_else(|| {
                            rate_limit.invalid(trust.as_str(), "a number of requests from 1")
                        })?;
                    limits[trust.index()] = Some(RateLimit {
                        requests,
                        window: Duration::from_secs(window_secs),
                    });
                }
            }
            rate_limit.finish()?;
        }
        let server = match root.section("server")? {
            Some(section) => server_section(section)?,
            None => ServerConfig::default(),
        };
        let authenticator = match root.take("tokens") {
            None => None,
            Some(Value::Array(tokens)) => {
                let mut authenticator = TokenAuthenticator::new();
                for (index, token) in tokens.into_iter().enumerate() {
                    let path = format!("tokens[{index}]");
                    let Value::Table(table) = token else {
                        return Err(Error::Config(format!("`{path}` must be a table")));
                    };
                    authenticator = token_entry(authenticator, Section::new(path, table))?;
                }
                Some(authenticator)
            }
            Some(_) => {
                return Err(Error::Config(
                    "`tokens` must be an array of tables (`[[tokens]]`)".to_owned(),
                ));
            }
        };
        root.finish()?;
        Ok(Config {
            authenticator,
            limits,
            trust_forwarded_for,
            cors_origins,
            security_headers,
            server,
        })
    }
}

fn server_section(mut server: Section) -> Result<ServerConfig, Error> {
    let mut secs = |key| Ok::<_, Error>(server.integer(key)?.map(Duration::from_secs));
    let config = ServerConfig {
        head_timeout: secs("head_timeout_secs")?,
        body_timeout: secs("body_timeout_secs")?,
        idle_timeout: secs("idle_timeout_secs")?,
        shutdown_grace: secs("shutdown_grace_secs")?,
        max_connections: server
            .integer("max_connections")?
            .map(|count| usize::try_from(count).unwrap_or(usize::MAX)),
    };
    server.finish()?;
    Ok(config)
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The keys a `CARMY_*` variable overrides: `rate_limit.known` is `CARMY_RATE_LIMIT_KNOWN`.
const OVERRIDABLE: &[&str] = &[
    "trust_forwarded_for",
    "security_headers",
    "cors.allowed_origins",
    "rate_limit.window_secs",
    "rate_limit.anonymous",
    "rate_limit.known",
    "rate_limit.partner",
    "rate_limit.internal",
    "server.head_timeout_secs",
    "server.body_timeout_secs",
    "server.idle_timeout_secs",
    "server.max_connections",
    "server.shutdown_grace_secs",
];

fn token_entry(
    authenticator: TokenAuthenticator,
    mut token: Section,
) -> Result<TokenAuthenticator, Error> {
    let id = token.string("id")?.ok_or_else(|| token.missing("id"))?;
    let trust = match token.string("trust")? {
        None => TrustLevel::Known,
        Some(name) => TrustLevel::from_name(&name).ok_or_else(|| {
            token.invalid(
                "trust",
                "one of `anonymous`, `known`, `partner`, `internal`",
            )
        })?,
    };
    let hash = token.string("hash")?.ok_or_else(|| token.missing("hash"))?;
    let permissions = token.strings("permissions")?;
    token.finish()?;
    let principal = permissions
        .into_iter()
        .fold(Principal::new(id, trust), Principal::with_permission);
    authenticator.token(&hash, principal)
}

/// Sets `path` (`section.key`) in `root`, creating the section.
fn set(root: &mut Table, path: &str, value: Value) {
    match path.split_once('.') {
        None => {
            root.insert(path.to_owned(), value);
        }
        Some((section, key)) => {
            let section = root.entry(section).or_insert(Value::Table(Table::new()));
            if let Value::Table(section) = section {
                section.insert(key.to_owned(), value);
            }
        }
    }
}

/// A table being read: every key taken is removed, so what is left at the end is unknown.
struct Section {
    /// The table's path, empty for the root.
    path: String,
    table: Table,
}

impl Section {
    fn root(table: Table) -> Self {
        Self::new(String::new(), table)
    }

    fn new(path: String, table: Table) -> Self {
        Section { path, table }
    }

    fn key_path(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    fn invalid(&self, key: &str, expected: &str) -> Error {
        Error::Config(format!("`{}` must be {expected}", self.key_path(key)))
    }

    fn missing(&self, key: &str) -> Error {
        Error::Config(format!("`{}` is required", self.key_path(key)))
    }

    fn take(&mut self, key: &str) -> Option<Value> {
        self.table.remove(key)
    }

    fn section(&mut self, key: &str) -> Result<Option<Section>, Error> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Table(table)) => Ok(Some(Section::new(self.key_path(key), table))),
            Some(_) => Err(self.invalid(key, "a table")),
        }
    }

    /// A boolean, or an override's `true` / `false`.
    fn bool(&mut self, key: &str) -> Result<Option<bool>, Error> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Boolean(value)) => Ok(Some(value)),
            Some(Value::String(text)) if text.parse::<bool>().is_ok() => Ok(text.parse().ok()),
            Some(_) => Err(self.invalid(key, "`true` or `false`")),
        }
    }

    /// A non-negative integer, or an override's digits.
    fn integer(&mut self, key: &str) -> Result<Option<u64>, Error> {
        let value = match self.take(key) {
            None => return Ok(None),
            Some(Value::Integer(value)) => u64::try_from(value).ok(),
            Some(Value::String(text)) => text.trim().parse().ok(),
            Some(_) => None,
        };
        value
            .map(Some)
            .ok_or_else(|| self.invalid(key, "a non-negative integer"))
    }

    fn string(&mut self, key: &str) -> Result<Option<String>, Error> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(value)) => Ok(Some(value)),
            Some(_) => Err(self.invalid(key, "a string")),
        }
    }

    /// An array of strings, or an override's comma-separated list.
    fn strings(&mut self, key: &str) -> Result<Vec<String>, Error> {
        match self.take(key) {
            None => Ok(Vec::new()),
            Some(Value::String(list)) => Ok(list
                .split(',')
                .map(str::trim)
                .filter(|item| !item.is_empty())
                .map(str::to_owned)
                .collect()),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| match item {
                    Value::String(item) => Ok(item),
                    _ => Err(self.invalid(key, "an array of strings")),
                })
                .collect(),
            Some(_) => Err(self.invalid(key, "an array of strings")),
        }
    }

    /// Refuses whatever key was not taken.
    fn finish(self) -> Result<(), Error> {
        match self.table.keys().next() {
            None => Ok(()),
            Some(key) => Err(Error::Config(format!(
                "unknown key `{}`",
                self.key_path(key)
            ))),
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
    fn unknown_keys_are_named_with_their_path() {
        let error = parse("[rate_limit]\nanonymus = 3\n").unwrap_err();
        assert!(
            error.contains("unknown key `rate_limit.anonymus`"),
            "{error}"
        );
        let error = parse("colour = 1\n").unwrap_err();
        assert!(error.contains("unknown key `colour`"), "{error}");
        let hash = crate::auth::hash_token("t");
        let error = parse(&format!(
            "[[tokens]]\nid = \"a\"\nhash = \"{hash}\"\nrole = \"x\"\n"
        ))
        .unwrap_err();
        assert!(error.contains("unknown key `tokens[0].role`"), "{error}");
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
        assert!(parse("[rate_limit]\nknown = \"many\"\n").is_err());
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
        assert!(error.to_string().contains("`rate_limit.known`"), "{error}");
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
        assert!(
            error.contains("unknown key `server.head_timeout`"),
            "{error}"
        );
    }

    #[test]
    fn tokens_are_stored_as_digests_only() {
        let error = parse("[[tokens]]\nid = \"a\"\nhash = \"plain-token\"\n").unwrap_err();
        assert!(error.contains("sha256:"), "{error}");
        assert!(
            parse("[[tokens]]\nhash = \"x\"\n")
                .unwrap_err()
                .contains("`tokens[0].id`")
        );
    }
}
