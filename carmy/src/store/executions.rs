//! The executions' contract (`protocol.md` §9): what a store keeps of an execution so that any
//! replica can answer a lookup, replay its events and pass on a cancellation.
//!
//! Executions are keyed by execution id and guarded by the caller's id: a lookup with another
//! caller's id finds nothing, exactly like a missing id.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::{StoreError, StoredResponse};
use crate::status::ExecutionStatus;

/// Progress events kept per execution: the latest ones (older progress is dropped; the start
/// and the end are always kept).
pub const KEPT_PROGRESS: usize = 100;

/// How long a reader waits, by default, before looking at an execution again.
pub(super) const RECHECK: Duration = Duration::from_millis(250);

/// Where an execution is: running, or ended with a status.
///
/// Exhaustive on purpose: its cases are the protocol's states.
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
///
/// Non-exhaustive: made with [`RecordedEvent::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordedEvent {
    /// The id the event was first sent with.
    pub id: u64,
    /// Its one-line JSON data.
    pub data: Bytes,
}

impl RecordedEvent {
    /// The event first sent with the id `id`, carrying `data`.
    pub fn new(id: u64, data: Bytes) -> Self {
        RecordedEvent { id, data }
    }
}

/// How a kept execution ended.
///
/// Non-exhaustive: made with [`RecordedOutcome::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordedOutcome {
    /// The answer, byte for byte.
    pub response: StoredResponse,
    /// The id of the `execution.completed` event.
    pub event_id: u64,
}

impl RecordedOutcome {
    /// The execution answered `response`, in the event numbered `event_id`.
    pub fn new(response: StoredResponse, event_id: u64) -> Self {
        RecordedOutcome { response, event_id }
    }
}

/// A kept execution, as its caller reads it back.
///
/// Non-exhaustive: made with [`ExecutionRecord::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// The execution `execution_id` of `tool`, with its latest `progress`, how it ended
    /// (`None` while it runs), and whether someone asked to cancel it.
    pub fn new(
        execution_id: impl Into<Arc<str>>,
        tool: impl Into<Arc<str>>,
        progress: Vec<RecordedEvent>,
        outcome: Option<RecordedOutcome>,
        cancel_requested: bool,
    ) -> Self {
        ExecutionRecord {
            execution_id: execution_id.into(),
            tool: tool.into(),
            progress,
            outcome,
            cancel_requested,
        }
    }

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
///
/// Non-exhaustive: made with [`ExecutionSummary::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecutionSummary {
    /// `exec_…`.
    pub execution_id: Arc<str>,
    /// The tool it runs.
    pub tool: Arc<str>,
    /// Running, or how it ended.
    pub state: ExecutionState,
}

impl ExecutionSummary {
    /// The execution `execution_id` of `tool`, in `state`.
    pub fn new(
        execution_id: impl Into<Arc<str>>,
        tool: impl Into<Arc<str>>,
        state: ExecutionState,
    ) -> Self {
        ExecutionSummary {
            execution_id: execution_id.into(),
            tool: tool.into(),
            state,
        }
    }
}

/// Which of a caller's executions to list, newest first.
///
/// Non-exhaustive: made with [`ExecutionQuery::new`], then narrowed through its fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
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

impl ExecutionQuery {
    /// The caller's `limit` newest executions, whatever their state and tool.
    pub fn new(limit: usize) -> Self {
        ExecutionQuery {
            limit,
            ..ExecutionQuery::default()
        }
    }
}

/// What a cancellation request found.
///
/// Exhaustive on purpose: the protocol answers each case differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancellation {
    /// No execution of this caller has that id.
    NotFound,
    /// It has ended already.
    Ended,
    /// It runs; the replica running it is told.
    Requested,
}

/// Where executions are kept for their callers (`protocol.md` §9): lookups, re-attachment,
/// cancellation, the list. Every shipped engine keeps them; a host that implements only
/// [`KeyStore`](super::KeyStore) gets them from the in-memory engine.
pub trait ExecutionStore: Send + Sync + 'static {
    /// Keeps the execution `execution_id` of `caller`, running, for at least `lease` (its
    /// deadline and a margin); visible to its caller on every replica once this returns.
    fn begin_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a Arc<str>,
        tool: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Adds a progress event to a running execution, keeping the latest [`KEPT_PROGRESS`].
    fn record_progress<'a>(
        &'a self,
        execution_id: &'a str,
        event: RecordedEvent,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Records how the execution ended; it is kept `ttl` longer.
    fn end_execution<'a>(
        &'a self,
        execution_id: &'a str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The execution `execution_id` if `caller` started it; `None` for anyone else, exactly as
    /// for an id that does not exist.
    fn execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ExecutionRecord>, StoreError>>;

    /// The caller's executions that match `query`, newest first.
    fn executions<'a>(
        &'a self,
        caller: &'a str,
        query: &'a ExecutionQuery,
    ) -> BoxFuture<'a, Result<Vec<ExecutionSummary>, StoreError>>;

    /// Asks for the caller's running execution to be cancelled; the replica running it learns
    /// it through [`ExecutionStore::execution_changed`].
    fn cancel_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Cancellation, StoreError>>;

    /// Resolves when the execution may have changed (an event, its end, a cancellation
    /// request), or after a short interval: readers then look again.
    fn execution_changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        let _ = execution_id;
        Box::pin(tokio::time::sleep(RECHECK))
    }

    /// Checks that the store answers, for the health checks (run in the background, never per
    /// request). `None`, the default, for a store in the process: nothing to check.
    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        None
    }
}

/// A shared store (`connect` returns one) is a store too.
impl<S: ExecutionStore + ?Sized> ExecutionStore for Arc<S> {
    fn begin_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a Arc<str>,
        tool: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).begin_execution(caller, execution_id, tool, lease)
    }

    fn record_progress<'a>(
        &'a self,
        execution_id: &'a str,
        event: RecordedEvent,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).record_progress(execution_id, event)
    }

    fn end_execution<'a>(
        &'a self,
        execution_id: &'a str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).end_execution(execution_id, outcome, ttl)
    }

    fn execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ExecutionRecord>, StoreError>> {
        (**self).execution(caller, execution_id)
    }

    fn executions<'a>(
        &'a self,
        caller: &'a str,
        query: &'a ExecutionQuery,
    ) -> BoxFuture<'a, Result<Vec<ExecutionSummary>, StoreError>> {
        (**self).executions(caller, query)
    }

    fn cancel_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Cancellation, StoreError>> {
        (**self).cancel_execution(caller, execution_id)
    }

    fn execution_changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        (**self).execution_changed(execution_id)
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        (**self).ping()
    }
}
