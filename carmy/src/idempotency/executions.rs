//! Executions kept for their callers (`protocol.md` §9): what a store keeps of an execution
//! so that any replica can answer a lookup, replay its events and pass on a cancellation.
//!
//! The store's execution half is keyed by execution id and guarded by the caller's id: a
//! lookup with another caller's id finds nothing, exactly like a missing id.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use super::{ExecutionStatus, StoreError, StoredResponse};

/// Progress events kept per execution: the latest ones (older progress is dropped; the start
/// and the end are always kept).
pub const KEPT_PROGRESS: usize = 100;

/// Where an execution is: running, or ended with a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecutionState {
    /// Still running.
    Running,
    /// Ended, with this status.
    Ended(ExecutionStatus),
}

impl ExecutionState {
    /// The wire name (`running`, or the ended status's).
    pub const fn as_str(self) -> &'static str {
        match self {
            ExecutionState::Running => "running",
            ExecutionState::Ended(status) => status.as_str(),
        }
    }

    /// The state whose wire name is `name`.
    pub fn from_wire(name: &str) -> Option<Self> {
        if name == "running" {
            Some(ExecutionState::Running)
        } else {
            ExecutionStatus::from_wire(name).map(ExecutionState::Ended)
        }
    }
}

/// One recorded event (`tool.progress` data): its original SSE id and its JSON data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvent {
    /// The id the event was first sent with.
    pub id: u64,
    /// Its one-line JSON data.
    pub data: Bytes,
}

/// How a kept execution ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedOutcome {
    /// The answer, byte for byte.
    pub response: StoredResponse,
    /// The id of the `execution.completed` event.
    pub event_id: u64,
}

/// A kept execution, as its caller reads it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionRecord {
    /// `exec_…`; its UUID v7 carries the creation time.
    pub execution_id: Arc<str>,
    /// The tool it runs.
    pub tool: Arc<str>,
    /// The latest progress events, oldest first (at most [`KEPT_PROGRESS`]).
    pub progress: Vec<RecordedEvent>,
    /// How it ended; `None` while it runs.
    pub outcome: Option<RecordedOutcome>,
    /// Someone asked to cancel it.
    pub cancel_requested: bool,
}

impl ExecutionRecord {
    /// Running, or how it ended.
    pub fn state(&self) -> ExecutionState {
        self.outcome
            .as_ref()
            .map_or(ExecutionState::Running, |outcome| {
                ExecutionState::Ended(outcome.response.status)
            })
    }
}

/// One line of a caller's list of executions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutionSummary {
    /// `exec_…`.
    pub execution_id: Arc<str>,
    /// The tool it runs.
    pub tool: Arc<str>,
    /// Running, or how it ended.
    pub state: ExecutionState,
}

/// Which of a caller's executions to list, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExecutionQuery {
    /// Only those in this state.
    pub state: Option<ExecutionState>,
    /// Only those of this tool.
    pub tool: Option<String>,
    /// Only those older than this execution id (the previous page's last).
    pub before: Option<String>,
    /// At most this many.
    pub limit: usize,
}

/// What a cancellation request found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancellation {
    /// No execution of this caller has that id.
    NotFound,
    /// It has ended already.
    Ended,
    /// It runs; the replica running it is told.
    Requested,
}

/// How long a reader of an execution that is not kept in this process waits before looking
/// again.
const RECHECK: Duration = Duration::from_millis(250);

/// The executions of an in-process store (memory, file): a map by id, an index per caller,
/// bounded by bytes (finished executions are evicted oldest first, running ones never).
pub(crate) struct ProcessExecutions {
    inner: Mutex<Executions>,
    max_bytes: usize,
}

#[derive(Default)]
struct Executions {
    by_id: HashMap<Arc<str>, Kept>,
    /// Per caller, execution ids in creation (id) order.
    by_caller: HashMap<Arc<str>, BTreeMap<Arc<str>, ()>>,
    /// Ended executions, oldest end first: eviction and expiry order.
    ended: VecDeque<Arc<str>>,
    bytes: usize,
}

struct Kept {
    caller: Arc<str>,
    tool: Arc<str>,
    progress: VecDeque<RecordedEvent>,
    outcome: Option<RecordedOutcome>,
    cancel_requested: bool,
    /// Sent on every change (event, end, cancellation request).
    changed: watch::Sender<()>,
    expires_at: Instant,
    bytes: usize,
}

impl Kept {
    fn weight(&self, execution_id: &str) -> usize {
        const FIXED: usize = size_of::<Kept>() + 3 * 16 + 64;
        FIXED
            + 2 * execution_id.len()
            + self.caller.len()
            + self.tool.len()
            + self
                .progress
                .iter()
                .map(|event| event.data.len() + size_of::<RecordedEvent>())
                .sum::<usize>()
            + self.outcome.as_ref().map_or(0, |outcome| {
                outcome.response.body.len() + outcome.response.code.as_deref().map_or(0, str::len)
            })
    }
}

/// An answer the in-process store has at once.
fn ready<T: Send + 'static>(value: T) -> BoxFuture<'static, Result<T, StoreError>> {
    Box::pin(std::future::ready(Ok(value)))
}

impl ProcessExecutions {
    pub(crate) fn new(max_bytes: usize) -> Self {
        ProcessExecutions {
            inner: Mutex::new(Executions::default()),
            max_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Executions> {
        // No code panics while holding the lock; recover the data if it ever happens.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// How many bytes the kept executions take, as the bound counts them.
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }

    pub(crate) fn begin(
        &self,
        caller: &str,
        execution_id: &Arc<str>,
        tool: &str,
        lease: Duration,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let now = Instant::now();
        let mut executions = self.lock();
        executions.expire_ended(now);
        let mut kept = Kept {
            caller: Arc::from(caller),
            tool: Arc::from(tool),
            progress: VecDeque::new(),
            outcome: None,
            cancel_requested: false,
            changed: watch::channel(()).0,
            // A running execution is never evicted; past its lease (its process died) it may.
            expires_at: now + lease,
            bytes: 0,
        };
        kept.bytes = kept.weight(execution_id);
        if !executions.make_room(kept.bytes, self.max_bytes) {
            return Box::pin(std::future::ready(Err(StoreError::message(
                "the store is full of running executions",
            ))));
        }
        executions.bytes += kept.bytes;
        executions
            .by_caller
            .entry(Arc::clone(&kept.caller))
            .or_default()
            .insert(Arc::clone(execution_id), ());
        executions.by_id.insert(Arc::clone(execution_id), kept);
        ready(())
    }

    pub(crate) fn progress(
        &self,
        execution_id: &str,
        event: RecordedEvent,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let mut executions = self.lock();
        let Executions { by_id, bytes, .. } = &mut *executions;
        let Some(kept) = by_id
            .get_mut(execution_id)
            .filter(|kept| kept.outcome.is_none())
        else {
            return ready(());
        };
        kept.progress.push_back(event);
        if kept.progress.len() > KEPT_PROGRESS {
            kept.progress.pop_front();
        }
        let weight = kept.weight(execution_id);
        *bytes = *bytes - kept.bytes + weight;
        kept.bytes = weight;
        kept.changed.send_replace(());
        ready(())
    }

    pub(crate) fn end(
        &self,
        execution_id: &str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let now = Instant::now();
        let mut executions = self.lock();
        let Some(id) = executions
            .by_id
            .get_key_value(execution_id)
            .map(|(id, _)| Arc::clone(id))
        else {
            return ready(());
        };
        let Some(kept) = executions
            .by_id
            .get_mut(execution_id)
            .filter(|kept| kept.outcome.is_none())
        else {
            return ready(());
        };
        kept.outcome = Some(outcome);
        kept.expires_at = now + ttl;
        let weight = kept.weight(execution_id);
        let previous = std::mem::replace(&mut kept.bytes, weight);
        kept.changed.send_replace(());
        executions.bytes = executions.bytes - previous + weight;
        executions.ended.push_back(id);
        let max_bytes = self.max_bytes;
        executions.make_room(0, max_bytes);
        ready(())
    }

    pub(crate) fn get(
        &self,
        caller: &str,
        execution_id: &str,
    ) -> BoxFuture<'static, Result<Option<ExecutionRecord>, StoreError>> {
        ready(self.record(caller, execution_id))
    }

    fn record(&self, caller: &str, execution_id: &str) -> Option<ExecutionRecord> {
        let executions = self.lock();
        let (id, kept) = executions.by_id.get_key_value(execution_id)?;
        if *kept.caller != *caller || kept.expires_at <= Instant::now() && kept.outcome.is_some() {
            return None;
        }
        Some(ExecutionRecord {
            execution_id: Arc::clone(id),
            tool: Arc::clone(&kept.tool),
            progress: kept.progress.iter().cloned().collect(),
            outcome: kept.outcome.clone(),
            cancel_requested: kept.cancel_requested,
        })
    }

    pub(crate) fn list(
        &self,
        caller: &str,
        query: &ExecutionQuery,
    ) -> BoxFuture<'static, Result<Vec<ExecutionSummary>, StoreError>> {
        ready(self.summaries(caller, query))
    }

    fn summaries(&self, caller: &str, query: &ExecutionQuery) -> Vec<ExecutionSummary> {
        let now = Instant::now();
        let executions = self.lock();
        let Some(ids) = executions.by_caller.get(caller) else {
            return Vec::new();
        };
        let upper = match &query.before {
            Some(before) => Bound::Excluded(before.as_str()),
            None => Bound::Unbounded,
        };
        ids.range::<str, _>((Bound::Unbounded, upper))
            .rev()
            .filter_map(|(id, ())| {
                let kept = executions.by_id.get(id)?;
                let live = kept.outcome.is_none() || kept.expires_at > now;
                let state = kept
                    .outcome
                    .as_ref()
                    .map_or(ExecutionState::Running, |outcome| {
                        ExecutionState::Ended(outcome.response.status)
                    });
                let wanted = live
                    && query.state.is_none_or(|wanted| wanted == state)
                    && query.tool.as_deref().is_none_or(|tool| tool == &*kept.tool);
                wanted.then(|| ExecutionSummary {
                    execution_id: Arc::clone(id),
                    tool: Arc::clone(&kept.tool),
                    state,
                })
            })
            .take(query.limit)
            .collect()
    }

    pub(crate) fn cancel(
        &self,
        caller: &str,
        execution_id: &str,
    ) -> BoxFuture<'static, Result<Cancellation, StoreError>> {
        let mut executions = self.lock();
        let found = match executions.by_id.get_mut(execution_id) {
            Some(kept) if *kept.caller == *caller => {
                if kept.outcome.is_some() {
                    Cancellation::Ended
                } else {
                    kept.cancel_requested = true;
                    kept.changed.send_replace(());
                    Cancellation::Requested
                }
            }
            _ => Cancellation::NotFound,
        };
        ready(found)
    }

    pub(crate) fn changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        let receiver = self
            .lock()
            .by_id
            .get(execution_id)
            .map(|kept| kept.changed.subscribe());
        match receiver {
            Some(mut receiver) => Box::pin(async move {
                // An error means the execution was evicted: a change too.
                let _ = receiver.changed().await;
            }),
            None => Box::pin(tokio::time::sleep(RECHECK)),
        }
    }

    pub(crate) fn purge_expired(&self) -> usize {
        self.lock().expire(Instant::now())
    }
}

impl Executions {
    /// Evicts ended executions, oldest first, until `incoming` more bytes fit.
    fn make_room(&mut self, incoming: usize, max_bytes: usize) -> bool {
        while self.bytes + incoming > max_bytes {
            let Some(oldest) = self.ended.pop_front() else {
                return false;
            };
            self.remove(&oldest);
        }
        true
    }

    /// Drops the ended executions past their ttl, oldest first (one ttl for all: the queue is
    /// in expiry order).
    fn expire_ended(&mut self, now: Instant) {
        while let Some(oldest) = self.ended.front() {
            match self.by_id.get(oldest) {
                Some(kept) if kept.expires_at > now => break,
                _ => {
                    let oldest = Arc::clone(oldest);
                    self.ended.pop_front();
                    self.remove(&oldest);
                }
            }
        }
    }

    /// Drops the ended executions past their ttl, and the running ones past their lease.
    fn expire(&mut self, now: Instant) -> usize {
        let expired: Vec<Arc<str>> = self
            .by_id
            .iter()
            .filter(|(_, kept)| kept.expires_at <= now)
            .map(|(id, _)| Arc::clone(id))
            .collect();
        for id in &expired {
            self.remove(id);
        }
        if !expired.is_empty() {
            let by_id = &self.by_id;
            self.ended.retain(|id| by_id.contains_key(id));
        }
        expired.len()
    }

    fn remove(&mut self, execution_id: &str) {
        let Some(kept) = self.by_id.remove(execution_id) else {
            return;
        };
        self.bytes -= kept.bytes;
        if let Some(ids) = self.by_caller.get_mut(&kept.caller) {
            ids.remove(execution_id);
            if ids.is_empty() {
                self.by_caller.remove(&kept.caller);
            }
        }
    }
}
