//! `[server]`: the listener's limits, restart-only, and the bounds every source of them keeps.

use std::time::Duration;

use crate::error::Error;

/// The longest head timeout accepted: a slow head holds a connection slot.
pub(crate) const MAX_HEAD_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest body timeout accepted.
pub(crate) const MAX_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest idle timeout accepted.
pub(crate) const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(75);
/// The `[server]` table of `carmy.toml`: what is set replaces the builder's value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ServerConfig {
    pub(crate) head_timeout: Option<Duration>,
    /// Applied to the router (the gate's body deadline), not to the connections.
    pub(crate) body_timeout: Option<Duration>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) max_connections: Option<usize>,
    pub(crate) shutdown_grace: Option<Duration>,
    pub(crate) drain_delay: Option<Duration>,
}

pub(crate) fn check_timeout(key: &str, timeout: Duration, max: Duration) -> Result<(), Error> {
    if timeout.is_zero() || timeout > max {
        return Err(Error::Config(format!(
            "`{key}` must be more than 0 and at most {} s",
            max.as_secs()
        )));
    }
    Ok(())
}

/// Refuses a body timeout of zero or above 30 s.
pub(crate) fn check_body_timeout(timeout: Duration) -> Result<(), Error> {
    check_timeout("body_timeout", timeout, MAX_BODY_TIMEOUT)
}
