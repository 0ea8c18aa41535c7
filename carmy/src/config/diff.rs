//! Which changes of a configuration a reload cannot apply.

use super::{Config, ServerConfig};

impl Config {
    /// The first restart-only key (`[server]`: the listener and connections are set up once;
    /// `[metrics] enabled`: the route and its middleware too) whose value differs in `next`.
    pub(crate) fn restart_required(&self, next: &Config) -> Option<&'static str> {
        let ServerConfig {
            head_timeout,
            body_timeout,
            idle_timeout,
            max_connections,
            shutdown_grace,
            drain_delay,
        } = self.server;
        let next_server = &next.server;
        [
            (
                "server.head_timeout_secs",
                head_timeout == next_server.head_timeout,
            ),
            (
                "server.body_timeout_secs",
                body_timeout == next_server.body_timeout,
            ),
            (
                "server.idle_timeout_secs",
                idle_timeout == next_server.idle_timeout,
            ),
            (
                "server.max_connections",
                max_connections == next_server.max_connections,
            ),
            (
                "server.shutdown_grace_secs",
                shutdown_grace == next_server.shutdown_grace,
            ),
            (
                "server.drain_delay_secs",
                drain_delay == next_server.drain_delay,
            ),
            (
                "metrics.enabled",
                self.metrics.enabled == next.metrics.enabled,
            ),
        ]
        .into_iter()
        .find(|&(_, same)| !same)
        .map(|(key, _)| key)
    }
}
