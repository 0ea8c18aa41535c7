//! Configuration reload (`protocol.md` §7): `carmy.toml` is read again on SIGHUP, when its
//! directory changes, and when an operator asks (`POST /agent/admin/reload`). The file is
//! parsed, checked and every derived object built before one atomic swap of the snapshot;
//! requests in flight keep the snapshot they started with. It knows nothing of HTTP.
//!
//! A file that fails keeps the configuration in force, is logged once, and shows as the `warn`
//! check `config` until a good file loads. A change to a `[server]` key or to `[metrics]
//! enabled` needs a restart: the whole file is refused, naming the key. An unchanged file
//! changes nothing.

mod watch;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::health::Health;
use crate::principal::TrustLevel;
use crate::settings::{Base, Current};

/// How many `tools.changed` events a slow subscriber may fall behind before it misses some.
const EVENT_BUFFER: usize = 16;

/// A `tools.changed` event: a reload changed what some trust level sees in the catalog.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsChanged {
    /// Indexed by [`TrustLevel::index`].
    versions: [String; 4],
}

impl ToolsChanged {
    /// The event's name, as the events issue will deliver it.
    pub const NAME: &'static str = "tools.changed";

    /// The new `tools_version` that callers trusted at `trust` see.
    pub fn tools_version(&self, trust: TrustLevel) -> &str {
        &self.versions[trust.index()]
    }
}

/// How many reloads ended each way since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReloadCounts {
    /// A new configuration was swapped in.
    pub applied: u64,
    /// The file had not changed: nothing was done.
    pub unchanged: u64,
    /// The file could not be read, parsed or built: the old configuration stayed.
    pub failed: u64,
    /// The file changed a restart-only key: the old configuration stayed.
    pub restart_required: u64,
}

/// The reloads of an app, from [`App::reloads`](crate::App::reloads): their counts by result,
/// and the `tools.changed` events. Cloning is cheap; every clone sees the same reloads.
#[derive(Debug, Clone, Default)]
pub struct Reloads {
    inner: Arc<ReloadsInner>,
}

#[derive(Debug)]
struct ReloadsInner {
    /// By result; `/metrics` exposes the same family as `carmy_config_reloads_total`.
    counts: Family<ReloadResult, Counter>,
    events: broadcast::Sender<ToolsChanged>,
}

/// The label of a reload's result.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReloadResult {
    result: &'static str,
}

impl ReloadResult {
    const APPLIED: Self = ReloadResult { result: "applied" };
    const UNCHANGED: Self = ReloadResult {
        result: "unchanged",
    };
    const FAILED: Self = ReloadResult { result: "failed" };
    const RESTART_REQUIRED: Self = ReloadResult {
        result: "restart_required",
    };
}

impl Default for ReloadsInner {
    fn default() -> Self {
        ReloadsInner {
            counts: Family::default(),
            events: broadcast::channel(EVENT_BUFFER).0,
        }
    }
}

impl Reloads {
    /// The counts now.
    pub fn counts(&self) -> ReloadCounts {
        let count = |result| self.inner.counts.get_or_create(&result).get();
        ReloadCounts {
            applied: count(ReloadResult::APPLIED),
            unchanged: count(ReloadResult::UNCHANGED),
            failed: count(ReloadResult::FAILED),
            restart_required: count(ReloadResult::RESTART_REQUIRED),
        }
    }

    /// The counts as a metric family, shared with these reloads.
    pub(crate) fn family(&self) -> Family<ReloadResult, Counter> {
        self.inner.counts.clone()
    }

    /// Receives every `tools.changed` event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<ToolsChanged> {
        self.inner.events.subscribe()
    }

    fn count(&self, outcome: &Result<Reloaded, ReloadError>) {
        let result = match outcome {
            Ok(Reloaded::Applied { .. }) => ReloadResult::APPLIED,
            Ok(Reloaded::Unchanged) => ReloadResult::UNCHANGED,
            Err(ReloadError::RestartRequired { .. }) => ReloadResult::RESTART_REQUIRED,
            Err(ReloadError::NoFile | ReloadError::Invalid(_)) => ReloadResult::FAILED,
        };
        self.inner.counts.get_or_create(&result).inc();
    }
}

/// What asked for a reload, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    Signal,
    File,
    Admin,
}

impl Trigger {
    const fn as_str(self) -> &'static str {
        match self {
            Trigger::Signal => "SIGHUP",
            Trigger::File => "file change",
            Trigger::Admin => "admin request",
        }
    }
}

/// A reload that kept the configuration valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reloaded {
    Applied {
        /// Some trust level's catalog changed (new `tools_version`).
        tools_changed: bool,
    },
    Unchanged,
}

/// A reload refused: the configuration in force stays.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ReloadError {
    #[error("the app was configured without a file: there is nothing to reload")]
    NoFile,
    /// The file cannot be read, has a syntax error, an unknown key, an invalid value or names
    /// an unknown tool; the message names the file and line.
    #[error("{0}")]
    Invalid(String),
    #[error("{file}: `{key}` changed, which needs a restart; nothing in the file was applied")]
    RestartRequired { file: String, key: &'static str },
}

/// Reloads one app's configuration file into its snapshot.
pub(crate) struct Reloader {
    /// `None` when the configuration did not come from a file.
    source: Option<PathBuf>,
    base: Base,
    current: Current,
    health: Health,
    reloads: Reloads,
    /// Held for a whole reload, so reloads happen one at a time.
    state: Mutex<State>,
    /// The file watcher and the SIGHUP listener, stopped with the reloader.
    watchers: Mutex<Vec<JoinHandle<()>>>,
}

struct State {
    /// The configuration at start: a restart-only key that differs from it needs a restart.
    started: Config,
    /// The configuration in force, to which an unchanged file is equal.
    applied: Config,
    /// The error last logged: a file that keeps failing is logged once.
    logged: Option<String>,
}

impl Reloader {
    /// A reloader of the file at `source`, whose `config` built the snapshot in `current`.
    pub(crate) fn new(
        source: Option<PathBuf>,
        config: Option<Config>,
        base: Base,
        current: Current,
        health: Health,
        reloads: Reloads,
    ) -> Arc<Self> {
        let config = config.unwrap_or_default();
        Arc::new(Reloader {
            source,
            base,
            current,
            health,
            reloads,
            state: Mutex::new(State {
                started: config.clone(),
                applied: config,
                logged: None,
            }),
            watchers: Mutex::new(Vec::new()),
        })
    }

    /// Starts reloading on SIGHUP and when the file's directory changes, until the reloader
    /// is dropped. Nothing starts without a file or outside a Tokio runtime.
    pub(crate) fn watch(self: &Arc<Self>) {
        let Some(source) = &self.source else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!("configuration reload not watching: no Tokio runtime");
            return;
        }
        let watchers = watch::spawn(Arc::downgrade(self), source);
        lock(&self.watchers).extend(watchers);
    }

    /// Reads the file again and swaps in what it builds, unless it fails, changes a
    /// restart-only key, or did not change.
    pub(crate) fn reload(&self, trigger: Trigger) -> Result<Reloaded, ReloadError> {
        let mut state = lock(&self.state);
        let outcome = match &self.source {
            Some(source) => self.apply(source, &mut state),
            None => Err(ReloadError::NoFile),
        };
        self.reloads.count(&outcome);
        match &outcome {
            Ok(reloaded) => {
                if *reloaded != Reloaded::Unchanged || state.logged.is_some() {
                    tracing::info!(
                        trigger = trigger.as_str(),
                        ?reloaded,
                        "configuration reloaded"
                    );
                }
                state.logged = None;
                self.health.report_config(None);
            }
            Err(error) => {
                let message = error.to_string();
                if state.logged.as_ref() != Some(&message) {
                    tracing::error!(
                        trigger = trigger.as_str(),
                        "configuration not reloaded: {message}"
                    );
                    state.logged = Some(message.clone());
                }
                self.health.report_config(Some(message));
            }
        }
        outcome
    }

    fn apply(&self, source: &std::path::Path, state: &mut State) -> Result<Reloaded, ReloadError> {
        let config =
            Config::load_from(source).map_err(|error| ReloadError::Invalid(error.to_string()))?;
        if let Some(key) = state.started.restart_required(&config) {
            return Err(ReloadError::RestartRequired {
                file: source.display().to_string(),
                key,
            });
        }
        if config == state.applied {
            return Ok(Reloaded::Unchanged);
        }
        let settings = self
            .base
            .build(Some(&config))
            .map_err(|error| ReloadError::Invalid(error.to_string()))?;
        let versions = settings.tools_versions().map(str::to_owned);
        let previous = self.current.swap(Arc::new(settings));
        state.applied = config;
        let tools_changed = previous.tools_versions() != versions.each_ref().map(String::as_str);
        if tools_changed {
            // Nobody subscribed is not an error: the event is for whoever listens.
            let _ = self.reloads.inner.events.send(ToolsChanged { versions });
        }
        Ok(Reloaded::Applied { tools_changed })
    }
}

impl Drop for Reloader {
    fn drop(&mut self) {
        for watcher in lock(&self.watchers).drain(..) {
            watcher.abort();
        }
    }
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("source", &self.source)
            .field("counts", &self.reloads.counts())
            .finish_non_exhaustive()
    }
}

/// A panic while holding a reload lock leaves a consistent value (each write is one
/// assignment): keep using it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
