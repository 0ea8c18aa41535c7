//! The background checks: each a named probe of something the service depends on (the app
//! hands them in: the shared store, the rate-limit backend), run every interval and cached, so
//! a probe request never touches a dependency.

use std::sync::Weak;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::{CheckResult, CheckStatus, Health, Inner};

/// How many failures in a row make a check fail, and readiness with it; fewer only warn, so one
/// lost packet does not take a replica out of service.
const FAILURES_TO_FAIL: u32 = 3;
/// How long one ping may take before it counts as a failure.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// A check of one dependency outside the process.
pub(crate) struct Probe {
    /// The component's name in `checks` and in the readiness lines.
    pub(crate) name: &'static str,
    /// Asks the dependency whether it answers; `Err` says what failed.
    pub(crate) ping: Box<dyn Fn() -> BoxFuture<'static, Result<(), String>> + Send + Sync>,
    /// Whether the dependency is in use now: one that is not (a rate limiter while the
    /// configuration in force sets no limit) is not checked (a reload may change it).
    pub(crate) in_use: Box<dyn Fn() -> bool + Send + Sync>,
}

/// One checked component and its recent history.
struct Component {
    probe: Probe,
    status: CheckStatus,
    failures: u32,
}

impl Component {
    fn new(probe: Probe) -> Self {
        Component {
            probe,
            status: CheckStatus::Pass,
            failures: 0,
        }
    }

    /// Forgets the component's history: no longer used, then used again, it starts afresh.
    fn restart(&mut self) {
        self.status = CheckStatus::Pass;
        self.failures = 0;
    }

    async fn check(&mut self) -> (&'static str, CheckResult) {
        let name = self.probe.name;
        let started = Instant::now();
        let outcome = tokio::time::timeout(PING_TIMEOUT, (self.probe.ping)())
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {PING_TIMEOUT:?}")));
        let observed = Some(started.elapsed());
        let (status, output) = match outcome {
            Ok(()) => {
                self.failures = 0;
                (CheckStatus::Pass, None)
            }
            Err(output) => {
                self.failures = self.failures.saturating_add(1);
                let status = if self.failures >= FAILURES_TO_FAIL {
                    CheckStatus::Fail
                } else {
                    CheckStatus::Warn
                };
                (status, Some(output))
            }
        };
        if status != self.status {
            tracing::warn!(
                check = name,
                status = status.as_str(),
                output = output.as_deref(),
                "health check changed"
            );
            self.status = status;
        }
        let result = CheckResult {
            status,
            observed,
            output,
        };
        (name, result)
    }
}

/// Starts the checker, or nothing without a probe. It stops when the health it reports to is
/// gone.
pub(super) fn spawn(
    health: Weak<Inner>,
    probes: Vec<Probe>,
    interval: Duration,
) -> Option<JoinHandle<()>> {
    let mut components: Vec<Component> = probes.into_iter().map(Component::new).collect();
    if components.is_empty() {
        return None;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::warn!("health checks not started: the router was built outside a Tokio runtime");
        return None;
    };
    Some(runtime.spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            let (used, unused): (Vec<&mut Component>, Vec<&mut Component>) = components
                .iter_mut()
                .partition(|component| (component.probe.in_use)());
            let results =
                futures_util::future::join_all(used.into_iter().map(Component::check)).await;
            let Some(inner) = health.upgrade() else {
                return;
            };
            let health = Health { inner };
            // A dependency no longer used is no longer a component; used again, it starts
            // afresh.
            for component in unused {
                component.restart();
                health.forget_check(component.probe.name);
            }
            health.record_checks(results);
        }
    }))
}
