//! The connection server under [`App::serve`](crate::App::serve), also usable with a host's own
//! router: timeouts on the request head and on idle connections, a cap on open connections, and
//! a graceful shutdown that always ends.
//!
//! hyper does the HTTP; the deadlines are kept here, per connection rather than per request:
//! the first head (hyper-util's protocol detection has no timeout of its own), each later
//! HTTP/1 head from its first byte, and any wait with no request in flight. hyper's own
//! `header_read_timeout` would arm a timer for every request, and would also hold a keep-alive
//! connection waiting for its next request to the head timeout instead of the idle one.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioExecutor;
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::config::{MAX_HEAD_TIMEOUT, MAX_IDLE_TIMEOUT, ServerConfig, check_timeout};
use crate::error::Error;
use crate::runtime::Runtime;

mod connection;
mod service;

use connection::Connection;

/// After the grace period, how long cancelled executions have to send their answers before
/// every connection is closed.
const CLOSE_MARGIN: Duration = Duration::from_secs(1);

/// Serves a router over HTTP/1 and HTTP/2 with the limits a public server needs, which a plain
/// `axum::serve` lacks: a deadline for each request head (also for a connection that sends
/// nothing, or stops inside the HTTP/2 preface), an idle timeout, a cap on open connections,
/// and a shutdown that closes every connection once the grace period is over.
///
/// [`App::serve`](crate::App::serve) uses it; a host that builds its own router from
/// [`App::router`](crate::App::router) serves it with [`Server::serve`].
///
/// ```no_run
/// # async fn run() -> Result<(), carmy::Error> {
/// let router = carmy::app().router()?.route("/health", axum::routing::get(|| async { "ok" }));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// carmy::Server::new().serve(listener, router, carmy::shutdown_signal()).await
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct Server {
    head_timeout: Duration,
    idle_timeout: Duration,
    max_connections: Option<usize>,
    shutdown_grace: Duration,
    drain_delay: Duration,
}

impl Default for Server {
    fn default() -> Self {
        Self::new()
    }
}

impl Server {
    /// Head timeout 10 s, idle timeout 60 s, connections capped by the file-descriptor limit,
    /// shutdown grace 10 s, of which the first 5 s drain.
    pub fn new() -> Self {
        Server {
            head_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: None,
            shutdown_grace: Duration::from_secs(10),
            drain_delay: Duration::from_secs(5),
        }
    }

    /// How long a client has to send a whole request head: the first from the moment the
    /// connection is accepted, a later one over HTTP/1 from its first byte; one deadline, not
    /// reset by each byte (default 10 s, at most 15).
    pub fn head_timeout(mut self, timeout: Duration) -> Self {
        self.head_timeout = timeout;
        self
    }

    /// How long a connection with no request in flight stays open (default 60 s, at most 75).
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// How many connections may be open at once; more wait to be accepted (default: three
    /// quarters of the process's file-descriptor limit, leaving the rest to stores and files).
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.max_connections = Some(connections);
        self
    }

    /// How long requests in flight may finish after the shutdown signal before every
    /// connection is closed (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// After the shutdown signal, how long the server keeps accepting and answering while
    /// readiness fails, so load balancers take the replica out before the listener closes
    /// (default 5 s; part of the grace period, cut to it).
    pub fn drain_delay(mut self, delay: Duration) -> Self {
        self.drain_delay = delay;
        self
    }

    /// The `[server]` settings of `carmy.toml` that are set.
    pub(crate) fn configure(mut self, config: &ServerConfig) -> Self {
        let ServerConfig {
            head_timeout,
            body_timeout: _,
            idle_timeout,
            max_connections,
            shutdown_grace,
            drain_delay,
        } = *config;
        self.head_timeout = head_timeout.unwrap_or(self.head_timeout);
        self.idle_timeout = idle_timeout.unwrap_or(self.idle_timeout);
        self.max_connections = max_connections.or(self.max_connections);
        self.shutdown_grace = shutdown_grace.unwrap_or(self.shutdown_grace);
        self.drain_delay = drain_delay.unwrap_or(self.drain_delay);
        self
    }

    /// Serves `router` on `listener` until `shutdown` resolves; then stops accepting, lets
    /// requests in flight finish within the grace period, and closes every connection.
    pub async fn serve(
        self,
        listener: TcpListener,
        router: Router,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        self.check()?;
        tracing::info!(addr = %listener.local_addr()?, "serving");
        self.run(listener, router, shutdown, None).await;
        Ok(())
    }

    /// Refuses timeouts of zero or above their maximum.
    pub(crate) fn check(&self) -> Result<(), Error> {
        check_timeout("head_timeout", self.head_timeout, MAX_HEAD_TIMEOUT)?;
        check_timeout("idle_timeout", self.idle_timeout, MAX_IDLE_TIMEOUT)?;
        if self.max_connections == Some(0) {
            return Err(Error::Config(
                "`max_connections` must be at least 1".to_owned(),
            ));
        }
        Ok(())
    }

    /// The accept loop, then the shutdown: with a `runtime`, its executions are drained too,
    /// and cancelled when the grace period is over.
    pub(crate) async fn run(
        &self,
        listener: TcpListener,
        router: Router,
        shutdown: impl Future<Output = ()>,
        runtime: Option<Arc<Runtime>>,
    ) {
        let max_connections = self.max_connections.unwrap_or_else(default_max_connections);
        tracing::debug!(max_connections, "connection limit");
        let slots = Arc::new(Semaphore::new(max_connections));
        let builder = Arc::new(self.builder());
        let graceful = GracefulShutdown::new();
        let close = CancellationToken::new();
        let drain_delay = self.drain_delay.min(self.shutdown_grace);
        let health = runtime.as_ref().map(|runtime| runtime.health().clone());
        let shutdown = async move {
            shutdown.await;
            if let Some(health) = health {
                health.begin_shutdown();
            }
            // Still accepting, readiness failing: load balancers take the replica out first.
            tracing::info!(?drain_delay, "shutting down: readiness fails, draining");
            tokio::time::sleep(drain_delay).await;
        };
        tokio::pin!(shutdown);
        loop {
            // At the cap, new connections wait in the listen backlog; silent ones holding the
            // slots are closed at the head timeout.
            let slot = tokio::select! {
                () = &mut shutdown => break,
                slot = Arc::clone(&slots).acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break,
                },
            };
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        accept_failed(&error).await;
                        continue;
                    }
                },
            };
            let connection = Connection {
                builder: Arc::clone(&builder),
                router: router.clone(),
                head_timeout: self.head_timeout,
                idle_timeout: self.idle_timeout,
                close: close.clone(),
            };
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                connection.serve(stream, peer, watcher).await;
                drop(slot);
            });
        }
        drop(listener);
        tracing::info!(grace = ?self.shutdown_grace, "shutting down: waiting for requests in flight");
        let connections = graceful.shutdown();
        tokio::pin!(connections);
        let rest_of_grace = self.shutdown_grace.saturating_sub(drain_delay);
        let drained = tokio::time::timeout(rest_of_grace, async {
            (&mut connections).await;
            if let Some(runtime) = &runtime {
                runtime.wait_idle().await;
            }
        })
        .await
        .is_ok();
        if !drained {
            if let Some(runtime) = &runtime {
                runtime.cancel_all();
            }
            // Cancelled executions answer at once: give those answers a moment to leave.
            if tokio::time::timeout(CLOSE_MARGIN, &mut connections)
                .await
                .is_err()
            {
                tracing::info!("closing the connections still open");
                close.cancel();
                connections.await;
            }
        }
        if let Some(runtime) = runtime
            && tokio::time::timeout(CLOSE_MARGIN, runtime.wait_idle())
                .await
                .is_err()
        {
            tracing::warn!("executions still recording their outcome at exit");
        }
    }

    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // The head deadlines are the connection's (see `expiry`), not a timer per request.
        builder.http1().header_read_timeout(None);
        builder
    }
}

/// Three quarters of the file-descriptor limit: each connection holds one, and the process
/// needs the rest (the listener, store connections, files).
fn default_max_connections() -> usize {
    let limit = fd_limit().unwrap_or(1 << 20).min(1 << 20);
    usize::try_from(limit - limit / 4).unwrap_or(1).max(1)
}

#[cfg(unix)]
fn fd_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

#[cfg(not(unix))]
fn fd_limit() -> Option<u64> {
    None
}

/// A failed `accept`: the peer's own failures are skipped; others (out of file descriptors)
/// are logged and retried after a pause rather than spinning.
async fn accept_failed(error: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        error.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(%error, "accepting a connection failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM: the shutdown signal of
/// [`App::serve`](crate::App::serve), for [`Server::serve`].
pub async fn shutdown_signal() {
    let interrupt = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked() {
        assert!(Server::new().check().is_ok());
        let too_long = Server::new().head_timeout(Duration::from_secs(16)).check();
        assert!(
            too_long
                .unwrap_err()
                .to_string()
                .contains("`head_timeout` must be more than 0 and at most 15 s")
        );
        assert!(Server::new().idle_timeout(Duration::ZERO).check().is_err());
        assert!(
            Server::new()
                .idle_timeout(Duration::from_secs(76))
                .check()
                .is_err()
        );
        assert!(Server::new().max_connections(0).check().is_err());
        assert!(crate::config::check_body_timeout(Duration::from_secs(31)).is_err());
        assert!(crate::config::check_body_timeout(Duration::from_secs(30)).is_ok());
    }

    #[cfg(unix)]
    #[test]
    fn the_connection_cap_follows_the_file_descriptor_limit() {
        let limit = fd_limit().expect("a finite limit");
        let cap = default_max_connections() as u64;
        assert!(cap < limit, "{cap} of {limit}");
        assert!(cap >= limit / 2, "{cap} of {limit}");
    }
}
