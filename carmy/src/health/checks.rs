//! The built-in checks: the shared idempotency store and the rate-limit backend, pinged in the
//! background every interval and cached, so a probe never touches a dependency.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use super::{CheckResult, CheckStatus, Health, Inner};
use crate::protection::RateLimiter;
use crate::store::KeyStore;

/// How many failures in a row make a check fail, and readiness with it; fewer only warn, so one
/// lost packet does not take a replica out of service.
const FAILURES_TO_FAIL: u32 = 3;
/// How long one ping may take before it counts as a failure.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

/// What the service depends on, checked when it lives outside the process.
pub(crate) struct Dependencies {
    pub(crate) store: Arc<dyn KeyStore>,
    /// The host's limiter; carmy's own, in process, has nothing to check.
    pub(crate) limiter: Option<Arc<dyn RateLimiter>>,
    /// Whether the configuration in force sets a rate limit: without one the limiter is never
    /// asked, so it is not checked either (a reload may change it).
    pub(crate) rate_limited: Box<dyn Fn() -> bool + Send + Sync>,
}

#[derive(Clone, Copy)]
enum Dependency {
    Store,
    RateLimiter,
}

impl Dependency {
    /// The component's name in `checks` and in the readiness lines.
    const fn name(self) -> &'static str {
        match self {
            Dependency::Store => "idempotency",
            Dependency::RateLimiter => "rate_limit",
        }
    }
}

impl Dependencies {
    /// Whether `dependency` is in use now.
    fn in_use(&self, dependency: Dependency) -> bool {
        match dependency {
            Dependency::Store => true,
            Dependency::RateLimiter => (self.rate_limited)(),
        }
    }

    /// Pings `dependency`; `None` when it has nothing outside the process to check.
    fn ping(
        &self,
        dependency: Dependency,
    ) -> Option<futures_util::future::BoxFuture<'_, Result<(), String>>> {
        use futures_util::FutureExt;
        match dependency {
            Dependency::Store => Some(
                self.store
                    .ping()?
                    .map(|result| result.map_err(|error| error.to_string()))
                    .boxed(),
            ),
            Dependency::RateLimiter => Some(
                self.limiter
                    .as_ref()?
                    .ping()?
                    .map(|result| result.map_err(|error| error.to_string()))
                    .boxed(),
            ),
        }
    }
}

/// One checked component and its recent history.
struct Component {
    dependency: Dependency,
    status: CheckStatus,
    failures: u32,
}

impl Component {
    fn new(dependency: Dependency) -> Self {
        Component {
            dependency,
            status: CheckStatus::Pass,
            failures: 0,
        }
    }

    async fn check(&mut self, dependencies: &Dependencies) -> (&'static str, CheckResult) {
        let name = self.dependency.name();
        let started = Instant::now();
        let outcome = match dependencies.ping(self.dependency) {
            Some(ping) => tokio::time::timeout(PING_TIMEOUT, ping)
                .await
                .unwrap_or_else(|_| Err(format!("no answer within {PING_TIMEOUT:?}"))),
            None => Ok(()),
        };
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

/// Starts the checker, or nothing when no dependency lives outside the process. It stops when
/// the health it reports to is gone.
pub(super) fn spawn(
    health: Weak<Inner>,
    dependencies: Dependencies,
    interval: Duration,
) -> Option<JoinHandle<()>> {
    let mut components: Vec<Component> = [Dependency::Store, Dependency::RateLimiter]
        .into_iter()
        .filter(|&dependency| dependencies.ping(dependency).is_some())
        .map(Component::new)
        .collect();
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
                .partition(|component| dependencies.in_use(component.dependency));
            let results = futures_util::future::join_all(
                used.into_iter()
                    .map(|component| component.check(&dependencies)),
            )
            .await;
            let Some(inner) = health.upgrade() else {
                return;
            };
            let health = Health { inner };
            // A dependency no longer used is no longer a component; used again, it starts
            // afresh.
            for component in unused {
                *component = Component::new(component.dependency);
                health.forget_check(component.dependency.name());
            }
            health.record_checks(results);
        }
    }))
}
