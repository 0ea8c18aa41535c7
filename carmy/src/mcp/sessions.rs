//! What carmy keeps of the SDK's sessions (the `initialize`/`Mcp-Session-Id` generation) so
//! that their plain `tools/call` can be answered directly ([`super::direct`]): the SDK keeps
//! its sessions to itself, and never sees the calls answered without it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use rmcp::model::RequestId;
use rmcp::transport::streamable_http_server::session::local::SessionConfig;
use tokio_util::sync::CancellationToken;

/// The SDK ends a session whose worker has seen nothing for its keep-alive (five minutes), and
/// a call answered directly never reaches the worker: a session whose last request went to the
/// SDK this long ago sends its next call there, which keeps it alive.
const HAND_OVER_EVERY: Duration =
    Duration::from_secs(SessionConfig::DEFAULT_KEEP_ALIVE.as_secs() / 5);

/// Below this many sessions, none is looked at for pruning.
const PRUNE_FROM: usize = 64;

/// The sessions the SDK opened, by id.
pub(super) struct Sessions {
    known: Mutex<Known>,
    /// Ends every session's calls answered directly (the server's shutdown).
    shutdown: CancellationToken,
}

struct Known {
    sessions: HashMap<Arc<str>, Session>,
    /// Stale sessions are pruned when there are this many.
    prune_at: usize,
}

struct Session {
    /// The client declared the tasks extension: its calls go to the SDK, which gives it tasks.
    takes_tasks: bool,
    /// When a request of this session last went to the SDK.
    handed_over: Instant,
    /// Fires when the session ends; each call answered directly runs under a child of it.
    ended: CancellationToken,
    /// The calls answered directly and still running, by JSON-RPC id, which
    /// `notifications/cancelled` names.
    running: HashMap<RequestId, CancellationToken>,
}

/// Set by the handler's `initialize` on the request that opens a session, which the SDK answers
/// with its id: what the client declared that decides how its calls are answered.
#[derive(Clone, Default)]
pub(crate) struct Opening(Arc<OnceLock<bool>>);

impl Opening {
    pub(crate) fn record(&self, takes_tasks: bool) {
        let _ = self.0.set(takes_tasks);
    }
}

/// A call answered directly, registered while it runs; dropping it unregisters it.
pub(super) struct RunningCall {
    sessions: Arc<Sessions>,
    session_id: Arc<str>,
    request_id: RequestId,
    cancel: CancellationToken,
}

impl RunningCall {
    /// Fires on `notifications/cancelled` naming the call, and when its session ends.
    pub(super) fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }
}

impl Drop for RunningCall {
    fn drop(&mut self) {
        let mut known = self.sessions.lock();
        if let Some(session) = known.sessions.get_mut(&*self.session_id) {
            session.running.remove(&self.request_id);
        }
    }
}

impl Sessions {
    pub(super) fn new(shutdown: CancellationToken) -> Self {
        Sessions {
            known: Mutex::new(Known {
                sessions: HashMap::new(),
                prune_at: PRUNE_FROM,
            }),
            shutdown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        // The map stays consistent whatever panicked while it was held.
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The SDK answered `opening` with the new session `id`.
    pub(super) fn opened(&self, id: &str, opening: &Opening) {
        let Some(&takes_tasks) = opening.0.get() else {
            return;
        };
        let now = Instant::now();
        let mut known = self.lock();
        if known.sessions.len() >= known.prune_at {
            // Sessions the SDK has ended by now on its own, unless their handler spoke since;
            // one pruned too early only sends its calls to the SDK.
            let keep_alive = SessionConfig::DEFAULT_KEEP_ALIVE;
            known.sessions.retain(|_, session| {
                !session.running.is_empty() || now.duration_since(session.handed_over) < keep_alive
            });
            known.prune_at = (known.sessions.len() * 2).max(PRUNE_FROM);
        }
        known.sessions.insert(
            Arc::from(id),
            Session {
                takes_tasks,
                handed_over: now,
                ended: self.shutdown.child_token(),
                running: HashMap::new(),
            },
        );
    }

    /// A request of session `id` goes to the SDK.
    pub(super) fn handed_over(&self, id: &str) {
        if let Some(session) = self.lock().sessions.get_mut(id) {
            session.handed_over = Instant::now();
        }
    }

    /// Registers call `request_id` of session `id` to be answered directly; `None` if it goes
    /// to the SDK: a session carmy did not see open, whose client takes tasks, that is due to
    /// be handed a request, or that runs a call of the same id already.
    pub(super) fn begin_call(
        self: &Arc<Self>,
        id: &str,
        request_id: &RequestId,
    ) -> Option<RunningCall> {
        let mut known = self.lock();
        let (session_id, _) = known.sessions.get_key_value(id)?;
        let session_id = Arc::clone(session_id);
        let session = known.sessions.get_mut(id)?;
        if session.takes_tasks
            || session.handed_over.elapsed() >= HAND_OVER_EVERY
            || session.running.contains_key(request_id)
        {
            return None;
        }
        let cancel = session.ended.child_token();
        session.running.insert(request_id.clone(), cancel.clone());
        Some(RunningCall {
            sessions: Arc::clone(self),
            session_id,
            request_id: request_id.clone(),
            cancel,
        })
    }

    /// `notifications/cancelled` of session `id` names `request_id`.
    pub(super) fn cancel_call(&self, id: &str, request_id: &RequestId) {
        if let Some(cancel) = self
            .lock()
            .sessions
            .get(id)
            .and_then(|session| session.running.get(request_id))
        {
            cancel.cancel();
        }
    }

    /// Session `id` has ended (deleted, or unknown to the SDK): its calls are cancelled.
    pub(super) fn ended(&self, id: &str) {
        if let Some(session) = self.lock().sessions.remove(id) {
            session.ended.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(sessions: &Sessions, id: &str, takes_tasks: bool) {
        let opening = Opening::default();
        opening.record(takes_tasks);
        sessions.opened(id, &opening);
    }

    #[test]
    fn calls_of_known_sessions_are_registered_once_per_id() {
        let sessions = Arc::new(Sessions::new(CancellationToken::new()));
        let id = RequestId::Number(1);
        assert!(
            sessions.begin_call("s", &id).is_none(),
            "an unknown session"
        );
        sessions.opened("s", &Opening::default());
        assert!(
            sessions.begin_call("s", &id).is_none(),
            "a session whose opening was not recorded"
        );
        opened(&sessions, "s", false);
        let call = sessions.begin_call("s", &id).expect("a known session");
        assert!(sessions.begin_call("s", &id).is_none(), "the same id twice");
        assert!(sessions.begin_call("s", &RequestId::Number(2)).is_some());
        drop(call);
        assert!(
            sessions.begin_call("s", &id).is_some(),
            "the id is free again"
        );
        opened(&sessions, "tasks", true);
        assert!(sessions.begin_call("tasks", &id).is_none());
    }

    #[test]
    fn a_call_is_cancelled_by_name_by_its_session_end_and_by_shutdown() {
        let shutdown = CancellationToken::new();
        let sessions = Arc::new(Sessions::new(shutdown.clone()));
        opened(&sessions, "a", false);
        opened(&sessions, "b", false);
        let first = sessions.begin_call("a", &RequestId::Number(1)).unwrap();
        let second = sessions.begin_call("a", &RequestId::Number(2)).unwrap();
        let other = sessions.begin_call("b", &RequestId::Number(1)).unwrap();
        sessions.cancel_call("a", &RequestId::Number(1));
        assert!(first.cancel_token().is_cancelled());
        assert!(!second.cancel_token().is_cancelled());
        assert!(!other.cancel_token().is_cancelled());
        sessions.ended("a");
        assert!(second.cancel_token().is_cancelled());
        assert!(!other.cancel_token().is_cancelled());
        assert!(sessions.begin_call("a", &RequestId::Number(3)).is_none());
        shutdown.cancel();
        assert!(other.cancel_token().is_cancelled());
    }

    #[test]
    fn a_session_long_unseen_by_the_sdk_is_handed_over_then_answered_again() {
        let sessions = Arc::new(Sessions::new(CancellationToken::new()));
        opened(&sessions, "s", false);
        let id = RequestId::Number(1);
        sessions.lock().sessions.get_mut("s").unwrap().handed_over -= HAND_OVER_EVERY;
        assert!(sessions.begin_call("s", &id).is_none());
        sessions.handed_over("s");
        assert!(sessions.begin_call("s", &id).is_some());
    }

    #[test]
    fn sessions_the_sdk_has_ended_are_pruned_unless_a_call_runs() {
        let sessions = Arc::new(Sessions::new(CancellationToken::new()));
        for n in 0..PRUNE_FROM {
            opened(&sessions, &n.to_string(), false);
        }
        let running = sessions.begin_call("0", &RequestId::Number(1)).unwrap();
        for session in sessions.lock().sessions.values_mut() {
            session.handed_over -= SessionConfig::DEFAULT_KEEP_ALIVE;
        }
        opened(&sessions, "new", false);
        let known = sessions.lock();
        let mut left: Vec<&str> = known.sessions.keys().map(|id| &**id).collect();
        left.sort_unstable();
        assert_eq!(left, ["0", "new"]);
        assert_eq!(known.prune_at, PRUNE_FROM);
        drop(known);
        drop(running);
    }
}
