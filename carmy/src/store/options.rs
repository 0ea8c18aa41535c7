//! How carmy talks to a shared store: its time limits, and the certificates it trusts over TLS.

use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "redis"))]
use super::StoreError;

/// The default of both time limits: a stalled store is reported well before a client gives up.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The default of [`StoreOptions::execution_recheck`].
const DEFAULT_RECHECK: Duration = Duration::from_secs(1);

/// Options for connecting to PostgreSQL or Redis (the idempotency stores, and the Redis rate
/// limiter). The URL can set the time limits too, with carmy's own query parameters:
/// `?acquire_timeout=2s&command_timeout=500ms` (the URL wins).
#[derive(Clone, PartialEq, Eq)]
#[must_use]
pub struct StoreOptions {
    pub(crate) acquire_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) execution_recheck: Duration,
    pub(crate) root_certificates: Vec<u8>,
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("acquire_timeout", &self.acquire_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("execution_recheck", &self.execution_recheck)
            .field("root_certificates", &self.root_certificates.len())
            .finish()
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreOptions {
    /// Five seconds for each time limit; a recheck every second; the platform's root
    /// certificates.
    pub fn new() -> Self {
        StoreOptions {
            acquire_timeout: DEFAULT_TIMEOUT,
            command_timeout: DEFAULT_TIMEOUT,
            execution_recheck: DEFAULT_RECHECK,
            root_certificates: Vec::new(),
        }
    }

    /// How long a call waits for a connection (from the pool, or a new one) before the store
    /// is reported unavailable (URL: `acquire_timeout`).
    pub fn acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// How long one statement or command may take, from sending it to its answer, before the
    /// store is reported unavailable (URL: `command_timeout`).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long a replica waiting on an execution that another replica runs (a re-attached
    /// event stream, a cancellation watch) trusts the store's announcements (LISTEN/NOTIFY,
    /// pub/sub) before reading the execution again anyway: the safety net for an announcement
    /// lost with a connection that died silently. One second by default; while the store's
    /// announcements are not heard at all, readers read every 200 ms.
    pub fn execution_recheck(mut self, interval: Duration) -> Self {
        self.execution_recheck = interval;
        self
    }

    /// Trusts the certificate authorities in `pem` (one or more PEM certificates) for TLS
    /// connections, instead of the platform's: for a server with a private CA (URL:
    /// `sslrootcert=PATH`, as libpq reads it).
    pub fn root_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_certificates = pem.into();
        self
    }

    /// Takes carmy's own query parameters out of `url`: the URL the engine's client reads, and
    /// these options with the URL's values.
    #[cfg(any(feature = "postgres", feature = "redis"))]
    pub(crate) fn with_url(mut self, url: &str) -> Result<(String, Self), StoreError> {
        let (url, params) =
            take_params(url, &["acquire_timeout", "command_timeout", "sslrootcert"]);
        for (name, value) in params {
            match name {
                "acquire_timeout" => self.acquire_timeout = duration(name, &value)?,
                "command_timeout" => self.command_timeout = duration(name, &value)?,
                _ => {
                    self.root_certificates = std::fs::read(&value).map_err(|error| {
                        StoreError::message(format!(
                            "`sslrootcert={value}` in the store URL: {error}"
                        ))
                    })?;
                }
            }
        }
        Ok((url, self))
    }
}

/// Takes the query parameters named `names` out of `url`: the URL without them, and their
/// values (the last of each wins when they are applied in order).
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) fn take_params<'n>(url: &str, names: &[&'n str]) -> (String, Vec<(&'n str, String)>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), Vec::new());
    };
    let (mut kept, mut taken) = (Vec::new(), Vec::new());
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match names.iter().find(|wanted| **wanted == name) {
            Some(wanted) => taken.push((*wanted, value.to_owned())),
            None => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, taken)
}

/// `500ms` or `2s`, more than zero.
#[cfg(any(feature = "postgres", feature = "redis"))]
fn duration(name: &str, value: &str) -> Result<Duration, StoreError> {
    let parsed = if let Some(millis) = value.strip_suffix("ms") {
        millis.parse().ok().map(Duration::from_millis)
    } else if let Some(seconds) = value.strip_suffix('s') {
        seconds.parse().ok().map(Duration::from_secs)
    } else {
        None
    };
    parsed
        .filter(|duration| !duration.is_zero())
        .ok_or_else(|| {
            StoreError::message(format!(
                "`{name}={value}` in the store URL: expected a duration such as 500ms or 5s"
            ))
        })
}

#[cfg(all(test, any(feature = "postgres", feature = "redis")))]
mod tests {
    use super::*;

    #[test]
    fn carmy_parameters_leave_the_url_and_others_stay() {
        let (url, options) = StoreOptions::new()
            .with_url("postgres://u@h/db?sslmode=require&command_timeout=250ms&acquire_timeout=2s")
            .unwrap();
        assert_eq!(url, "postgres://u@h/db?sslmode=require");
        assert_eq!(options.command_timeout, Duration::from_millis(250));
        assert_eq!(options.acquire_timeout, Duration::from_secs(2));
        let (url, options) = StoreOptions::new()
            .with_url("redis://h:1/0?command_timeout=1s")
            .unwrap();
        assert_eq!(url, "redis://h:1/0");
        assert_eq!(options.acquire_timeout, DEFAULT_TIMEOUT);
        for bad in [
            "command_timeout=5",
            "command_timeout=0ms",
            "acquire_timeout=soon",
        ] {
            let error = StoreOptions::new()
                .with_url(&format!("redis://h?{bad}"))
                .unwrap_err();
            assert!(error.to_string().contains("expected a duration"), "{error}");
        }
    }
}
