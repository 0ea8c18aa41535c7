//! Configuration reload (`protocol.md` §7): `carmy.toml` is read again on SIGHUP, when its
//! directory changes, and when an operator asks (`POST /agent/admin/reload`). The file is
//! parsed, checked and every derived object built before one atomic swap of the snapshot;
//! requests in flight keep the snapshot they started with. It knows nothing of HTTP.
//!
//! A file that fails keeps the configuration in force, is logged once, and shows as the `warn`
//! check `config` until a good file loads. A change to a `[server]` key or to `[metrics]
//! enabled` needs a restart: the whole file is refused, naming the key. An unchanged file
//! changes nothing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::task::JoinHandle;

use super::watch;
use super::{Base, Current};
use crate::config::Config;
use crate::health::Health;
use crate::reload::{ReloadResult, Reloads, ToolsChanged};

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
        self.reloads.count(&result_of(&outcome));
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
            self.reloads.publish(ToolsChanged { versions });
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

/// The label a reload's outcome is counted under.
fn result_of(outcome: &Result<Reloaded, ReloadError>) -> ReloadResult {
    match outcome {
        Ok(Reloaded::Applied { .. }) => ReloadResult::APPLIED,
        Ok(Reloaded::Unchanged) => ReloadResult::UNCHANGED,
        Err(ReloadError::RestartRequired { .. }) => ReloadResult::RESTART_REQUIRED,
        Err(ReloadError::NoFile | ReloadError::Invalid(_)) => ReloadResult::FAILED,
    }
}
