//! One accepted connection, served by hyper and watched here: its head and idle deadlines,
//! and its close at the end of a shutdown.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::service::{ConnectionService, connection_extensions};

/// One accepted connection and what it needs to be served.
pub(super) struct Connection {
    pub(super) builder: Arc<auto::Builder<TokioExecutor>>,
    pub(super) router: Router,
    pub(super) head_timeout: Duration,
    pub(super) idle_timeout: Duration,
    pub(super) close: CancellationToken,
}

impl Connection {
    pub(super) async fn serve(
        self,
        stream: TcpStream,
        peer: SocketAddr,
        watcher: hyper_util::server::graceful::Watcher,
    ) {
        // Events of a stream are small writes: without TCP_NODELAY, Nagle's algorithm holds
        // each one back until the previous is acknowledged.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::warn!(%error, "could not set TCP_NODELAY");
        }
        let activity = Arc::new(Activity::new());
        let service = ConnectionService {
            router: self.router,
            extensions: connection_extensions(peer),
            activity: Arc::clone(&activity),
        };
        let io = TokioIo::new(WatchedStream {
            stream,
            activity: Arc::clone(&activity),
        });
        let builder = self.builder;
        // The connection runs in a task of its own, watched from this one: its deadlines and
        // the close are looked at when they come, not each time a request wakes the
        // connection, as a `select!` over the three would.
        let mut connection = tokio::spawn(async move {
            let connection = watcher.watch(builder.serve_connection_with_upgrades(io, service));
            if let Err(error) = connection.await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
        tokio::select! {
            _ = &mut connection => return,
            () = expiry(&activity, self.head_timeout, self.idle_timeout) => {
                tracing::debug!(%peer, "connection closed: no request in time");
            }
            () = self.close.cancelled() => {}
        }
        connection.abort();
        // The socket is closed when the aborted task is dropped: only then is its slot free.
        let _ = connection.await;
    }
}

/// The requests of one connection: how many are in flight, how many have started, since when
/// none is in flight, and since when the next HTTP/1 head has been arriving. Counted without
/// waking anything: a wake-up per request would poll the whole connection (and its socket)
/// again; [`expiry`] looks on its own schedule.
#[derive(Debug)]
pub(super) struct Activity {
    opened: tokio::time::Instant,
    in_flight: AtomicUsize,
    started: AtomicU64,
    /// Milliseconds from `opened` to the end of the last request.
    idle_since_ms: AtomicU64,
    /// Milliseconds from `opened` to the first byte of a head not yet whole, or [`NO_HEAD`].
    head_since_ms: AtomicU64,
    /// HTTP/2: requests are streams, and bytes between them (pings, settings) are no head.
    multiplexed: AtomicBool,
}

const NO_HEAD: u64 = u64::MAX;

impl Activity {
    /// The connection serves HTTP/2: several requests share it, which its head deadline minds.
    pub(super) fn multiplexed(&self) {
        self.multiplexed.store(true, Ordering::Release);
    }

    fn new() -> Self {
        Activity {
            opened: tokio::time::Instant::now(),
            in_flight: AtomicUsize::new(0),
            started: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(NO_HEAD),
            multiplexed: AtomicBool::new(false),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(NO_HEAD - 1)
    }

    /// Bytes arrived: with no request in flight on an HTTP/1 connection that has served one,
    /// they begin the next head, whose deadline starts now.
    fn bytes_read(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since_ms.load(Ordering::Acquire) == NO_HEAD
            && self.started.load(Ordering::Acquire) > 0
            && !self.multiplexed.load(Ordering::Acquire)
        {
            self.head_since_ms
                .store(self.elapsed_ms(), Ordering::Release);
        }
    }
}

pin_project_lite::pin_project! {
    /// A connection's socket, telling its [`Activity`] when bytes arrive.
    struct WatchedStream {
        #[pin]
        stream: TcpStream,
        activity: Arc<Activity>,
    }
}

impl AsyncRead for WatchedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.project();
        let before = buffer.filled().len();
        ready!(this.stream.poll_read(context, buffer))?;
        if buffer.filled().len() > before {
            this.activity.bytes_read();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for WatchedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.project().stream.poll_write(context, bytes)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        self.project().stream.poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().stream.poll_flush(context)
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.project().stream.poll_shutdown(context)
    }
}

/// Resolves when the connection has waited too long for a request: the head timeout before
/// its first request (this covers protocol detection, which has no timeout of its own) and,
/// over HTTP/1, from the first byte of each later head; the idle timeout after the last
/// request ended.
async fn expiry(activity: &Activity, head: Duration, idle: Duration) {
    loop {
        let now = tokio::time::Instant::now();
        let deadline = if activity.started.load(Ordering::Acquire) == 0 {
            activity.opened + head
        } else if activity.in_flight.load(Ordering::Acquire) > 0 {
            now + idle
        } else {
            match activity.head_since_ms.load(Ordering::Acquire) {
                NO_HEAD => {
                    let idle_since = activity.idle_since_ms.load(Ordering::Acquire);
                    activity.opened + Duration::from_millis(idle_since) + idle
                }
                head_since => activity.opened + Duration::from_millis(head_since) + head,
            }
        };
        if deadline <= now {
            return;
        }
        // Nothing announces a request or a head: look again within the shorter timeout, so
        // that a deadline starting meanwhile is kept to.
        tokio::time::sleep_until(deadline.min(now + head.min(idle))).await;
    }
}

/// One request in flight on a connection, until dropped.
pub(super) struct InFlight(Arc<Activity>);

impl InFlight {
    pub(super) fn start(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        activity.started.fetch_add(1, Ordering::AcqRel);
        activity.head_since_ms.store(NO_HEAD, Ordering::Release);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        activity
            .idle_since_ms
            .store(activity.elapsed_ms(), Ordering::Release);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}
