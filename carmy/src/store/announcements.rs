//! Announcements that an execution changed, heard from a shared store (PostgreSQL's
//! LISTEN/NOTIFY, Redis pub/sub): a replica streaming, awaiting or running an execution learns
//! of another replica's event, end or cancellation request as it happens, not by polling.
//!
//! The writer announces in the same statement or script that changes the execution; each
//! store keeps one listening connection. While it is down (connecting, or lost with the
//! engine), readers fall back to reading every [`POLL`]; each reconnection wakes them all, so
//! nothing announced in between is missed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, StreamExt};
use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;

use super::StoreError;

/// How often a reader reads an execution again while announcements are not heard: a
/// cancellation still reaches the running replica well inside the 1 s the protocol allows.
pub(crate) const POLL: Duration = Duration::from_millis(200);

/// The first pause before listening again after the connection was lost; it doubles up to
/// [`MAX_RECONNECT_PAUSE`].
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
const MAX_RECONNECT_PAUSE: Duration = Duration::from_secs(5);

/// The execution ids announced by one listening connection; it ends when the connection does.
pub(crate) type AnnouncedIds = BoxStream<'static, String>;

/// The readers waiting for a change, by execution id.
pub(crate) struct Announcements {
    waiting: Mutex<Waiting>,
    listening: AtomicBool,
    recheck: Duration,
}

#[derive(Default)]
struct Waiting {
    by_id: HashMap<Box<str>, watch::Sender<()>>,
    /// The map's size after the last sweep of ids nobody waits on any more.
    swept_at: usize,
}

impl Announcements {
    /// Readers that hear announcements read again after `recheck` anyway: the safety net for
    /// an announcement lost with a connection that died silently.
    pub(crate) fn new(recheck: Duration) -> Arc<Self> {
        Arc::new(Announcements {
            waiting: Mutex::new(Waiting::default()),
            listening: AtomicBool::new(false),
            recheck,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Waiting> {
        // No code panics while holding the lock; recover the data if it ever happens.
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Resolves when `execution_id` is announced, when announcements resume after an outage,
    /// or after the recheck interval ([`POLL`] while announcements are not heard).
    pub(crate) fn changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        let mut receiver = {
            let mut waiting = self.lock();
            let Waiting { by_id, swept_at } = &mut *waiting;
            if by_id.len() >= 2 * (*swept_at).max(64) {
                by_id.retain(|_, sender| sender.receiver_count() > 0);
                *swept_at = by_id.len();
            }
            by_id
                .entry(Box::from(execution_id))
                .or_insert_with(|| watch::channel(()).0)
                .subscribe()
        };
        let wait = if self.listening.load(Ordering::Acquire) {
            self.recheck
        } else {
            POLL
        };
        Box::pin(async move {
            let _ = tokio::time::timeout(wait, receiver.changed()).await;
        })
    }

    fn announce(&self, execution_id: &str) {
        let mut waiting = self.lock();
        if let Some(sender) = waiting.by_id.get(execution_id)
            && sender.send(()).is_err()
        {
            waiting.by_id.remove(execution_id);
        }
    }

    /// Records whether announcements are heard, and wakes every reader to read again.
    fn set_listening(&self, listening: bool) {
        self.listening.store(listening, Ordering::Release);
        self.lock()
            .by_id
            .retain(|_, sender| sender.send(()).is_ok());
    }

    /// Hears `first` (a connection the store opened with itself, so that announcements work
    /// from the start), then listens again with `reconnect` whenever the connection is lost,
    /// until the returned handle is dropped.
    pub(crate) fn listen<F>(
        self: &Arc<Self>,
        first: AnnouncedIds,
        reconnect: F,
    ) -> AbortOnDropHandle<()>
    where
        F: Fn() -> BoxFuture<'static, Result<AnnouncedIds, StoreError>> + Send + 'static,
    {
        let announcements = Arc::clone(self);
        AbortOnDropHandle::new(tokio::spawn(async move {
            let mut ids = Some(first);
            let mut pause = RECONNECT_PAUSE;
            loop {
                if let Some(mut heard) = ids.take() {
                    announcements.set_listening(true);
                    pause = RECONNECT_PAUSE;
                    while let Some(execution_id) = heard.next().await {
                        announcements.announce(&execution_id);
                    }
                    announcements.set_listening(false);
                    tracing::warn!(
                        "lost the store's execution announcements; reading executions every \
                         {POLL:?} until they are heard again"
                    );
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RECONNECT_PAUSE);
                match reconnect().await {
                    Ok(heard) => {
                        tracing::info!("hearing the store's execution announcements again");
                        ids = Some(heard);
                    }
                    Err(error) => {
                        tracing::debug!(%error, "could not listen for execution announcements");
                    }
                }
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_reader_wakes_on_its_announcement_and_only_on_its_own() {
        let announcements = Announcements::new(Duration::from_secs(3600));
        announcements.listening.store(true, Ordering::Release);
        let mut mine = announcements.changed("exec_a");
        announcements.announce("exec_b");
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut mine)
                .await
                .is_err(),
            "another execution's announcement leaves it waiting"
        );
        announcements.announce("exec_a");
        tokio::time::timeout(Duration::from_millis(1), mine)
            .await
            .expect("woken by its own announcement");
    }

    #[tokio::test(start_paused = true)]
    async fn without_announcements_readers_poll_and_resuming_wakes_them_all() {
        let announcements = Announcements::new(Duration::from_secs(3600));
        let started = tokio::time::Instant::now();
        announcements.changed("exec_a").await;
        assert_eq!(
            started.elapsed(),
            POLL,
            "not listening: read again after POLL"
        );

        announcements.listening.store(true, Ordering::Release);
        let waiting: Vec<_> = (0..3)
            .map(|n| announcements.changed(&format!("exec_{n}")))
            .collect();
        announcements.set_listening(true);
        tokio::time::timeout(
            Duration::from_millis(1),
            futures_util::future::join_all(waiting),
        )
        .await
        .expect("a reconnection wakes every reader");
    }

    #[tokio::test]
    async fn ids_nobody_waits_on_are_swept() {
        let announcements = Announcements::new(Duration::from_secs(3600));
        for n in 0..1_000 {
            drop(announcements.changed(&format!("exec_{n}")));
        }
        assert!(announcements.lock().by_id.len() <= 128);
    }
}
