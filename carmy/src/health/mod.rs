//! The service's health (`protocol.md` §6): a state machine that applications and the built-in
//! checks move, the cached results of those checks, and readiness. It knows nothing of HTTP.
//!
//! ```text
//! healthy ──▶ degrading ──▶ degraded
//!    ▲            │             │
//!    └────────────┴─────────────┘
//! ```

mod checks;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;

pub(crate) use checks::Probe;

/// How many `health.changed` events a slow subscriber may fall behind before it misses some.
const EVENT_BUFFER: usize = 64;

/// Where the service stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HealthState {
    /// Everything works.
    Healthy,
    /// Something is wrong but the service still answers; readiness holds unless a required
    /// dependency fails.
    Degrading,
    /// The service should not receive traffic: readiness fails.
    Degraded,
}

impl HealthState {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Degrading => "degrading",
            HealthState::Degraded => "degraded",
        }
    }

    /// `healthy` → `degrading` → `degraded`, and back to `healthy` from either. Staying put is
    /// not a transition.
    const fn may_become(self, to: HealthState) -> bool {
        matches!(
            (self, to),
            (HealthState::Healthy, HealthState::Degrading)
                | (HealthState::Degrading, HealthState::Degraded)
                | (
                    HealthState::Degrading | HealthState::Degraded,
                    HealthState::Healthy
                )
        )
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The verdict of one check, or of the service as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum CheckStatus {
    Pass,
    Warn,
    Fail,
}

impl CheckStatus {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            CheckStatus::Pass => "pass",
            CheckStatus::Warn => "warn",
            CheckStatus::Fail => "fail",
        }
    }
}

/// A `health.changed` event: the state machine moved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HealthChanged {
    /// The state before.
    pub from: HealthState,
    /// The state now.
    pub to: HealthState,
    /// Why, as reported (none when back to `healthy`).
    pub reason: Option<String>,
    /// When the transition happened.
    pub since: SystemTime,
}

impl HealthChanged {
    /// The event's name, as webhooks deliver it (`protocol.md` §8).
    pub const NAME: &'static str = "health.changed";
}

/// A report that would move the state machine along a transition it does not have (only
/// `healthy` → `degraded` directly, and `degraded` → `degrading`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the service cannot go from `{from}` to `{to}`")]
pub struct TransitionError {
    /// The state the service is in.
    pub from: HealthState,
    /// The state asked for.
    pub to: HealthState,
}

/// The service's health, shared by the host (from [`App::health`](crate::App::health)), the
/// tools (from [`Context::health`](crate::Context::health)) and the health routes. Cloning is
/// cheap; every clone moves the same state machine.
#[derive(Clone)]
pub struct Health {
    inner: Arc<Inner>,
}

struct Inner {
    machine: Mutex<Machine>,
    /// The cached result of each component, by name.
    checks: Mutex<BTreeMap<&'static str, CheckResult>>,
    events: broadcast::Sender<HealthChanged>,
    shutting_down: AtomicBool,
    /// The background checker, stopped with the last handle.
    checker: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(checker) = lock(&self.checker).take() {
            checker.abort();
        }
    }
}

struct Machine {
    state: HealthState,
    since: SystemTime,
    reason: Option<String>,
    /// The built-in checks (not the application) moved it: their recovery moves it back.
    by_checks: bool,
}

/// The last result of one component's check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckResult {
    pub(crate) status: CheckStatus,
    /// How long the check took.
    pub(crate) observed: Option<Duration>,
    /// What went wrong, for `internal` callers only.
    pub(crate) output: Option<String>,
}

impl CheckResult {
    const PASS: CheckResult = CheckResult {
        status: CheckStatus::Pass,
        observed: None,
        output: None,
    };
}

/// The configuration component: `warn` while the last configuration reload failed.
const CONFIG_CHECK: &str = "config";
/// The event outbox: `warn` while it has dropped events recently; absent until it first has.
#[cfg(feature = "events")]
const EVENTS_CHECK: &str = "events";

/// What the health routes show, taken at once.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) state: HealthState,
    pub(crate) since: SystemTime,
    pub(crate) reason: Option<String>,
    pub(crate) checks: BTreeMap<&'static str, CheckResult>,
    pub(crate) shutting_down: bool,
}

impl Snapshot {
    /// `pass` (healthy), `warn` (degrading) or `fail` (degraded).
    pub(crate) fn status(&self) -> CheckStatus {
        match self.state {
            HealthState::Healthy => CheckStatus::Pass,
            HealthState::Degrading => CheckStatus::Warn,
            HealthState::Degraded => CheckStatus::Fail,
        }
    }

    /// Each reason readiness may fail, with whether it holds: every check (only a `fail`
    /// counts; a `warn` still serves), the state machine, and the shutdown.
    pub(crate) fn readiness(&self) -> Vec<(&str, bool)> {
        let mut lines: Vec<(&str, bool)> = self
            .checks
            .iter()
            .map(|(name, result)| (*name, result.status != CheckStatus::Fail))
            .collect();
        lines.push(("state", self.state != HealthState::Degraded));
        lines.push(("shutdown", !self.shutting_down));
        lines
    }

    /// Whether the service should receive traffic.
    pub(crate) fn ready(&self) -> bool {
        self.readiness().iter().all(|&(_, ok)| ok)
    }
}

impl Health {
    /// A healthy service, since now, with the `config` component passing.
    pub(crate) fn new() -> Self {
        Health {
            inner: Arc::new(Inner {
                machine: Mutex::new(Machine {
                    state: HealthState::Healthy,
                    since: SystemTime::now(),
                    reason: None,
                    by_checks: false,
                }),
                checks: Mutex::new(BTreeMap::from([(CONFIG_CHECK, CheckResult::PASS)])),
                events: broadcast::channel(EVENT_BUFFER).0,
                shutting_down: AtomicBool::new(false),
                checker: Mutex::new(None),
            }),
        }
    }

    /// Moves `healthy` → `degrading`: something is wrong, the service still serves.
    pub fn report_degrading(&self, reason: impl Into<String>) -> Result<(), TransitionError> {
        self.move_to(HealthState::Degrading, Some(reason.into()), false)
    }

    /// Moves `degrading` → `degraded`: readiness fails until [`Health::report_healthy`].
    pub fn report_degraded(&self, reason: impl Into<String>) -> Result<(), TransitionError> {
        self.move_to(HealthState::Degraded, Some(reason.into()), false)
    }

    /// Moves back to `healthy` from `degrading` or `degraded`.
    pub fn report_healthy(&self) -> Result<(), TransitionError> {
        self.move_to(HealthState::Healthy, None, false)
    }

    /// The state now.
    pub fn state(&self) -> HealthState {
        self.machine().state
    }

    /// Receives every `health.changed` event from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<HealthChanged> {
        self.inner.events.subscribe()
    }

    /// Fails readiness from now on, so load balancers stop sending traffic while the listener
    /// still answers. [`App::serve`](crate::App::serve) calls it on SIGTERM; call it yourself
    /// when you serve the router another way.
    pub fn begin_shutdown(&self) {
        self.inner.shutting_down.store(true, Ordering::Relaxed);
    }

    /// A report of the current state changes nothing (several tools may report one problem),
    /// except that the application then owns the state: the checks' recovery leaves it.
    fn move_to(
        &self,
        to: HealthState,
        reason: Option<String>,
        by_checks: bool,
    ) -> Result<(), TransitionError> {
        let mut machine = self.machine();
        let from = machine.state;
        if from == to {
            machine.by_checks &= by_checks;
            return Ok(());
        }
        if !from.may_become(to) {
            return Err(TransitionError { from, to });
        }
        let since = SystemTime::now();
        *machine = Machine {
            state: to,
            since,
            reason: reason.clone(),
            by_checks,
        };
        drop(machine);
        tracing::warn!(%from, %to, reason = reason.as_deref(), "health changed");
        // Nobody subscribed is not an error: the event is for whoever listens.
        let _ = self.inner.events.send(HealthChanged {
            from,
            to,
            reason,
            since,
        });
        Ok(())
    }

    /// Records a round of background checks and moves the state machine: a required
    /// dependency failing makes a healthy service `degrading`; once none fails, a state the
    /// checks set goes back to `healthy`. A state the application set is the application's.
    fn record_checks(&self, results: Vec<(&'static str, CheckResult)>) {
        let failing: Vec<&str> = results
            .iter()
            .filter(|(_, result)| result.status == CheckStatus::Fail)
            .map(|(name, _)| *name)
            .collect();
        lock(&self.inner.checks).extend(results);
        let (state, by_checks) = {
            let machine = self.machine();
            (machine.state, machine.by_checks)
        };
        // Transitions are refused only when another report raced this one; the next round
        // settles it.
        if !failing.is_empty() && state == HealthState::Healthy {
            let reason = format!("failing: {}", failing.join(", "));
            let _ = self.move_to(HealthState::Degrading, Some(reason), true);
        } else if failing.is_empty() && by_checks && state != HealthState::Healthy {
            let _ = self.move_to(HealthState::Healthy, None, true);
        }
    }

    /// Shows a failed configuration reload as the `warn` check `config`, whose output (for
    /// `internal` callers) is `error`; `None` (a good file loaded) passes it again. A bad file
    /// keeps the old configuration serving, so readiness holds.
    pub(crate) fn report_config(&self, error: Option<String>) {
        self.report_warning(CONFIG_CHECK, error);
    }

    /// Shows events the outbox dropped, being full, as the `warn` check `events`, whose output
    /// (for `internal` callers) is `dropped`; `None` passes it again. The service still serves.
    #[cfg(feature = "events")]
    pub(crate) fn report_events(&self, dropped: Option<String>) {
        self.report_warning(EVENTS_CHECK, dropped);
    }

    /// The component `name`: `warn` with `warning` as its output, or `pass`.
    fn report_warning(&self, name: &'static str, warning: Option<String>) {
        let result = match warning {
            None => CheckResult::PASS,
            Some(warning) => CheckResult {
                status: CheckStatus::Warn,
                observed: None,
                output: Some(warning),
            },
        };
        lock(&self.inner.checks).insert(name, result);
    }

    /// Removes a component no longer checked.
    fn forget_check(&self, name: &str) {
        lock(&self.inner.checks).remove(name);
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let (state, since, reason) = {
            let machine = self.machine();
            (machine.state, machine.since, machine.reason.clone())
        };
        Snapshot {
            state,
            since,
            reason,
            checks: lock(&self.inner.checks).clone(),
            shutting_down: self.inner.shutting_down.load(Ordering::Relaxed),
        }
    }

    /// Starts checking with `probes` every `interval` in the background, until the last
    /// handle is dropped. Nothing to check starts nothing.
    pub(crate) fn watch(&self, probes: Vec<Probe>, interval: Duration) {
        if let Some(checker) = checks::spawn(Arc::downgrade(&self.inner), probes, interval) {
            *lock(&self.inner.checker) = Some(checker);
        }
    }

    fn machine(&self) -> MutexGuard<'_, Machine> {
        lock(&self.inner.machine)
    }
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let machine = self.machine();
        f.debug_struct("Health")
            .field("state", &machine.state)
            .field("reason", &machine.reason)
            .finish_non_exhaustive()
    }
}

/// A panic while holding a health lock leaves a consistent value (every write is one
/// assignment): keep using it.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transitions() {
        use HealthState::{Degraded, Degrading, Healthy};
        let allowed = [
            (Healthy, Degrading),
            (Degrading, Degraded),
            (Degrading, Healthy),
            (Degraded, Healthy),
        ];
        for from in [Healthy, Degrading, Degraded] {
            for to in [Healthy, Degrading, Degraded] {
                assert_eq!(
                    from.may_become(to),
                    allowed.contains(&(from, to)),
                    "{from} → {to}"
                );
            }
        }
    }

    #[test]
    fn checks_move_only_what_they_set() {
        let health = Health::new();
        let failing = CheckResult {
            status: CheckStatus::Fail,
            observed: None,
            output: Some("down".to_owned()),
        };
        health.record_checks(vec![("idempotency", failing.clone())]);
        assert_eq!(health.state(), HealthState::Degrading);
        assert_eq!(
            health.snapshot().reason.as_deref(),
            Some("failing: idempotency")
        );
        health.record_checks(vec![("idempotency", CheckResult::PASS)]);
        assert_eq!(health.state(), HealthState::Healthy);

        // The application's own report survives the checks' recovery.
        health.report_degrading("slow upstream").unwrap();
        health.record_checks(vec![("idempotency", failing)]);
        health.record_checks(vec![("idempotency", CheckResult::PASS)]);
        assert_eq!(health.state(), HealthState::Degrading);
        assert_eq!(health.snapshot().reason.as_deref(), Some("slow upstream"));
    }
}
