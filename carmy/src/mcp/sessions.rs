//! What carmy keeps of the SDK's sessions (the `initialize`/`Mcp-Session-Id` generation): who
//! opened each one, which no other caller may use; how many each caller and the server have
//! open, which are capped; and what lets their plain `tools/call` be answered directly
//! ([`super::direct`]): the SDK keeps its sessions to itself, and never sees the calls answered
//! without it.
//!
//! A session is known here from the answer that opened it until the SDK closes it (a `DELETE`,
//! its idle end, the shutdown), which [`super::manager`] reports.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{Extensions, HeaderMap};
use rmcp::model::RequestId;
use rmcp::transport::streamable_http_server::session::local::SessionConfig;
use tokio_util::sync::CancellationToken;

use crate::http::Admitted;
use crate::principal::Principal;
use crate::protection::RateKey;

/// How many sessions may be open at once, and for how long one may be idle.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionLimits {
    /// Sessions one caller may have open (or being opened) at once.
    pub(crate) per_caller: usize,
    /// Sessions the server keeps open at once, all callers together.
    pub(crate) total: usize,
    /// How long a session may go without a request before the SDK ends it.
    pub(crate) idle: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            per_caller: 32,
            total: 4_096,
            idle: SessionConfig::DEFAULT_KEEP_ALIVE,
        }
    }
}

/// Who opened a session: the caller's id and, for a caller nobody vouched for, the address it
/// connects from (as its rate limit counts it); served without connection info, anonymous
/// callers share one owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Owner {
    id: Arc<str>,
    peer: Option<IpAddr>,
}

impl Owner {
    /// The caller of a request that passed the gate.
    pub(super) fn of(headers: &HeaderMap, extensions: &Extensions) -> Owner {
        let Some(admitted) = extensions.get::<Admitted>() else {
            return Owner {
                id: Principal::anonymous().shared_id(),
                peer: None,
            };
        };
        let principal = &admitted.principal;
        let protection = &admitted.settings.protection;
        let peer = match protection.rate_key(principal, headers, extensions) {
            RateKey::Principal(_) => None,
            RateKey::Peer(peer) => peer,
        };
        Owner {
            id: principal.shared_id(),
            peer,
        }
    }
}

/// A cap that refused a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// The caller has [`SessionLimits::per_caller`] sessions open.
    Caller(usize),
    /// The server has [`SessionLimits::total`] sessions open.
    Server(usize),
}

/// Whether a request may use the session it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Access {
    /// The caller opened it.
    Owned,
    /// Another caller did: the request is answered as for a session that does not exist.
    Foreign,
    /// No such session.
    Unknown,
}

/// The sessions the SDK opened, by id.
pub(super) struct Sessions {
    known: Mutex<Known>,
    limits: SessionLimits,
    /// The SDK ends a session whose worker has seen nothing for [`SessionLimits::idle`], and a
    /// call answered directly never reaches the worker: a session whose last request went to
    /// the SDK this long ago sends its next call there, which keeps it alive.
    hand_over_every: Duration,
    /// Ends every session's calls answered directly (the server's shutdown).
    shutdown: CancellationToken,
}

#[derive(Default)]
struct Known {
    sessions: HashMap<Arc<str>, Session>,
    /// Sessions open or being opened, by owner.
    owners: HashMap<Owner, usize>,
    /// Sessions open or being opened, all owners together.
    total: usize,
}

struct Session {
    owner: Owner,
    /// The client declared the tasks extension (or carmy did not see what it declared): its
    /// calls go to the SDK.
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

/// A place for a session being opened, counted against its owner's cap and the server's until
/// the session opens ([`Sessions::opened`]) or the place is dropped.
pub(super) struct Reservation {
    sessions: Arc<Sessions>,
    owner: Option<Owner>,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            self.sessions.lock().release(&owner);
        }
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

impl Known {
    /// One session of `owner` fewer.
    fn release(&mut self, owner: &Owner) {
        self.total = self.total.saturating_sub(1);
        if let Entry::Occupied(mut count) = self.owners.entry(owner.clone()) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
        // A burst of sessions leaves tables sized for it: give the memory back once most of
        // them have ended.
        shrink(&mut self.sessions);
        shrink(&mut self.owners);
    }
}

/// Frees most of a table's memory when it holds under a quarter of what it has room for.
fn shrink<K: Eq + std::hash::Hash, V>(table: &mut HashMap<K, V>) {
    if table.capacity() > 64 && table.len() < table.capacity() / 4 {
        table.shrink_to(table.len() * 2);
    }
}

impl Sessions {
    pub(super) fn new(limits: SessionLimits, shutdown: CancellationToken) -> Self {
        Sessions {
            known: Mutex::new(Known::default()),
            limits,
            hand_over_every: limits.idle / 5,
            shutdown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        // The tables stay consistent whatever panicked while they were held.
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a session `owner` opens, unless the owner or the server is at its cap.
    pub(super) fn reserve(self: &Arc<Self>, owner: Owner) -> Result<Reservation, Full> {
        let mut known = self.lock();
        if known.total >= self.limits.total {
            return Err(Full::Server(self.limits.total));
        }
        let count = known.owners.entry(owner.clone()).or_default();
        if *count >= self.limits.per_caller {
            return Err(Full::Caller(self.limits.per_caller));
        }
        *count += 1;
        known.total += 1;
        Ok(Reservation {
            sessions: Arc::clone(self),
            owner: Some(owner),
        })
    }

    /// A place for a session `owner` opened without carmy seeing it coming: it is theirs
    /// whatever the caps say.
    pub(super) fn adopt(self: &Arc<Self>, owner: Owner) -> Reservation {
        let mut known = self.lock();
        *known.owners.entry(owner.clone()).or_default() += 1;
        known.total += 1;
        Reservation {
            sessions: Arc::clone(self),
            owner: Some(owner),
        }
    }

    /// The SDK answered `opening` with the new session `id`, which takes the `reserved` place.
    pub(super) fn opened(&self, id: &str, opening: &Opening, mut reserved: Reservation) {
        let Some(owner) = reserved.owner.take() else {
            return;
        };
        let session = Session {
            owner,
            takes_tasks: opening.0.get().copied().unwrap_or(true),
            handed_over: Instant::now(),
            ended: self.shutdown.child_token(),
            running: HashMap::new(),
        };
        let mut known = self.lock();
        if let Some(replaced) = known.sessions.insert(Arc::from(id), session) {
            // Ids are random: never, but a place is not lost for it.
            known.release(&replaced.owner);
        }
    }

    /// Whether `owner` may use session `id`.
    pub(super) fn access(&self, id: &str, owner: &Owner) -> Access {
        match self.lock().sessions.get(id) {
            None => Access::Unknown,
            Some(session) if session.owner == *owner => Access::Owned,
            Some(_) => Access::Foreign,
        }
    }

    /// A request of session `id` goes to the SDK.
    pub(super) fn handed_over(&self, id: &str) {
        if let Some(session) = self.lock().sessions.get_mut(id) {
            session.handed_over = Instant::now();
        }
    }

    /// Registers call `request_id` of session `id` to be answered directly; `None` if it goes
    /// to the SDK: a session carmy does not know, whose client takes tasks, that is due to be
    /// handed a request, or that runs a call of the same id already.
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
            || session.handed_over.elapsed() >= self.hand_over_every
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

    /// Session `id` has ended (the SDK closed it): its calls are cancelled and its owner's
    /// place is free.
    pub(super) fn ended(&self, id: &str) {
        let mut known = self.lock();
        if let Some(session) = known.sessions.remove(id) {
            known.release(&session.owner);
            drop(known);
            session.ended.cancel();
        }
    }

    /// How many sessions are open or being opened.
    #[cfg(test)]
    pub(super) fn count(&self) -> usize {
        self.lock().total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(id: &str) -> Owner {
        Owner {
            id: Arc::from(id),
            peer: None,
        }
    }

    fn limits(per_caller: usize, total: usize) -> SessionLimits {
        SessionLimits {
            per_caller,
            total,
            ..SessionLimits::default()
        }
    }

    fn sessions() -> Arc<Sessions> {
        Arc::new(Sessions::new(limits(8, 64), CancellationToken::new()))
    }

    fn opened(sessions: &Arc<Sessions>, id: &str, takes_tasks: bool) {
        let opening = Opening::default();
        opening.record(takes_tasks);
        let reserved = sessions.reserve(owner("a")).unwrap();
        sessions.opened(id, &opening, reserved);
    }

    #[test]
    fn calls_of_known_sessions_are_registered_once_per_id() {
        let sessions = sessions();
        let id = RequestId::Number(1);
        assert!(
            sessions.begin_call("s", &id).is_none(),
            "an unknown session"
        );
        let reserved = sessions.reserve(owner("a")).unwrap();
        sessions.opened("s", &Opening::default(), reserved);
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
        let sessions = Arc::new(Sessions::new(SessionLimits::default(), shutdown.clone()));
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
        let sessions = sessions();
        opened(&sessions, "s", false);
        let id = RequestId::Number(1);
        sessions.lock().sessions.get_mut("s").unwrap().handed_over -= sessions.hand_over_every;
        assert!(sessions.begin_call("s", &id).is_none());
        sessions.handed_over("s");
        assert!(sessions.begin_call("s", &id).is_some());
    }

    #[test]
    fn a_session_is_its_owners_alone() {
        let sessions = sessions();
        opened(&sessions, "s", false);
        assert_eq!(sessions.access("s", &owner("a")), Access::Owned);
        assert_eq!(sessions.access("s", &owner("b")), Access::Foreign);
        assert_eq!(sessions.access("t", &owner("a")), Access::Unknown);
        let anonymous = |peer: [u8; 4]| Owner {
            id: Principal::anonymous().shared_id(),
            peer: Some(IpAddr::from(peer)),
        };
        let reserved = sessions.reserve(anonymous([10, 0, 0, 1])).unwrap();
        sessions.opened("p", &Opening::default(), reserved);
        assert_eq!(
            sessions.access("p", &anonymous([10, 0, 0, 1])),
            Access::Owned
        );
        assert_eq!(
            sessions.access("p", &anonymous([10, 0, 0, 2])),
            Access::Foreign
        );
    }

    #[test]
    fn each_caller_and_the_server_are_capped_and_ended_sessions_free_their_place() {
        let sessions = Arc::new(Sessions::new(limits(2, 3), CancellationToken::new()));
        let open = |id: &str, who: &str| {
            let reserved = sessions.reserve(owner(who))?;
            sessions.opened(id, &Opening::default(), reserved);
            Ok::<_, Full>(())
        };
        open("a1", "a").unwrap();
        open("a2", "a").unwrap();
        assert_eq!(open("a3", "a"), Err(Full::Caller(2)));
        // A place being opened counts; dropped unopened, it is free again.
        let pending = sessions.reserve(owner("b")).unwrap();
        assert_eq!(open("c1", "c"), Err(Full::Server(3)));
        drop(pending);
        open("c1", "c").unwrap();
        assert_eq!(sessions.count(), 3);
        sessions.ended("a1");
        sessions.ended("a1");
        assert_eq!(sessions.count(), 2);
        open("a3", "a").unwrap();
        for id in ["a2", "a3", "c1"] {
            sessions.ended(id);
        }
        assert_eq!(sessions.count(), 0);
        let known = sessions.lock();
        assert!(known.sessions.is_empty() && known.owners.is_empty());
    }

    #[test]
    fn tables_give_their_memory_back_once_a_burst_has_ended() {
        let sessions = Arc::new(Sessions::new(
            limits(10_000, 10_000),
            CancellationToken::new(),
        ));
        for n in 0..5_000 {
            let reserved = sessions.reserve(owner(&n.to_string())).unwrap();
            sessions.opened(&n.to_string(), &Opening::default(), reserved);
        }
        for n in 0..5_000 {
            sessions.ended(&n.to_string());
        }
        let known = sessions.lock();
        assert!(
            known.sessions.capacity() < 256,
            "{}",
            known.sessions.capacity()
        );
        assert!(known.owners.capacity() < 256, "{}", known.owners.capacity());
    }
}
