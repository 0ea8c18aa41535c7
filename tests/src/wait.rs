//! Waiting in tests: every wait has a deadline, and fails the test naming what it waited for,
//! rather than hanging the run.

use std::future::Future;
use std::time::Duration;

/// How long a test waits for what should follow promptly (a tool starting, a cancellation
/// seen, an execution ending, a write landing) before it fails: generous, because the tests
/// share two cores with each other.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// How often [`until`] and [`eventually`] look again.
const POLL: Duration = Duration::from_millis(20);

/// Awaits `future`; fails the test, naming `what`, unless it ends within `limit`.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"))
}

/// Asks `found` until it gives something, and gives that; fails the test, naming `what`,
/// after `limit`. On tokio's clock, so paused time runs on through the waits.
pub async fn until<T>(limit: Duration, what: &str, mut found: impl AsyncFnMut() -> Option<T>) -> T {
    within(limit, what, async {
        loop {
            if let Some(found) = found().await {
                return found;
            }
            tokio::time::sleep(POLL).await;
        }
    })
    .await
}

/// Checks `condition` until it holds; fails the test, naming `what`, after `limit`.
pub async fn eventually(limit: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    until(limit, what, async || condition().await.then_some(())).await;
}
