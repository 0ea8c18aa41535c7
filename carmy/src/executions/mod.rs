//! Executions as resources (`protocol.md` §9): a caller reads its executions back by id, replays
//! and follows their events, cancels them and lists them, on any replica, through the store.
//! Starting one detached is the pipeline's own ([`Runtime::call`](crate::runtime::Runtime)).
//!
//! Everything is scoped to the caller: another caller's execution (an anonymous caller has
//! none) is reported exactly like a missing one.

mod time;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use serde_json::{Value, json};

use crate::principal::{Principal, TrustLevel};
use crate::runtime::{STARTED_EVENT_ID, response};
use crate::status::ExecutionStatus;
use crate::store::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionState, ExecutionStore,
    ExecutionSummary, StoreError,
};
use crate::tool_error::ToolError;
use crate::wire::codes;

pub(crate) use time::created_at;

/// When to look again at a running execution, in the `Retry-After` of its answers.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long a cancellation waits for the execution to end, to say whether it took effect: the
/// replica running it hears of it at once, or within a second when an announcement was lost.
pub(crate) const CANCEL_SETTLES_WITHIN: Duration = Duration::from_secs(5);

/// The executions of one app, read back from its store.
#[derive(Clone)]
pub(crate) struct Executions {
    store: Arc<dyn ExecutionStore>,
}

/// One event of an execution's stream, with the id it was first sent with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReplayedEvent {
    pub(crate) id: u64,
    pub(crate) name: &'static str,
    pub(crate) data: String,
}

/// What asking for a cancellation came to.
#[derive(Debug)]
pub(crate) enum Cancelled {
    /// No execution of this caller has that id.
    NotFound,
    /// It had ended, or it ended otherwise before the cancellation could take effect.
    Ended,
    /// It ended cancelled; or it still ran when the wait was over, and the request stands.
    Accepted(ExecutionRecord),
}

/// A page of a caller's executions.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) executions: Vec<ExecutionSummary>,
    /// Where the next page starts, when there may be one.
    pub(crate) next_cursor: Option<String>,
}

impl Executions {
    pub(crate) fn new(store: Arc<dyn ExecutionStore>) -> Self {
        Executions { store }
    }

    /// The caller whose executions `principal` may see, if any.
    fn owner(&self, principal: &Principal) -> Option<Arc<str>> {
        (principal.trust() != TrustLevel::Anonymous).then(|| principal.shared_id())
    }

    /// The caller's execution `execution_id`, if it is theirs.
    pub(crate) async fn lookup(
        &self,
        principal: &Principal,
        execution_id: &str,
    ) -> Result<Option<ExecutionRecord>, ToolError> {
        let Some(caller) = self.owner(principal) else {
            return Ok(None);
        };
        if !is_execution_id(execution_id) {
            return Ok(None);
        }
        self.store
            .execution(&caller, execution_id)
            .await
            .map_err(|error| unavailable(&error))
    }

    /// Asks for the caller's running execution to be cancelled.
    pub(crate) async fn cancel(
        &self,
        principal: &Principal,
        execution_id: &str,
    ) -> Result<Cancellation, ToolError> {
        let Some(caller) = self.owner(principal) else {
            return Ok(Cancellation::NotFound);
        };
        if !is_execution_id(execution_id) {
            return Ok(Cancellation::NotFound);
        }
        self.store
            .cancel_execution(&caller, execution_id)
            .await
            .map_err(|error| unavailable(&error))
    }

    /// Asks for the caller's running execution to be cancelled, then waits, up to `within`, for
    /// it to end: a tool that returned as the request arrived ends `completed`, and the
    /// cancellation did not take effect.
    pub(crate) async fn cancel_settled(
        &self,
        principal: &Principal,
        execution_id: &str,
        within: Duration,
    ) -> Result<Cancelled, ToolError> {
        match self.cancel(principal, execution_id).await? {
            Cancellation::NotFound => return Ok(Cancelled::NotFound),
            Cancellation::Ended => return Ok(Cancelled::Ended),
            Cancellation::Requested => {}
        }
        let Some(caller) = self.owner(principal) else {
            return Ok(Cancelled::NotFound);
        };
        let until = tokio::time::Instant::now() + within;
        loop {
            // Watch before reading: an end after the read is not missed.
            let changed = self.store.execution_changed(execution_id);
            let record = self
                .store
                .execution(&caller, execution_id)
                .await
                .map_err(|error| unavailable(&error))?;
            let Some(record) = record else {
                return Ok(Cancelled::NotFound);
            };
            match record.state() {
                ExecutionState::Ended(ExecutionStatus::Cancelled) => {
                    return Ok(Cancelled::Accepted(record));
                }
                ExecutionState::Ended(_) => return Ok(Cancelled::Ended),
                ExecutionState::Running => {}
            }
            if tokio::time::timeout_at(until, changed).await.is_err() {
                return Ok(Cancelled::Accepted(record));
            }
        }
    }

    /// A page of the caller's executions, newest first. `query.limit` is the page size.
    pub(crate) async fn list(
        &self,
        principal: &Principal,
        mut query: ExecutionQuery,
    ) -> Result<Page, ToolError> {
        let Some(caller) = self.owner(principal) else {
            return Ok(Page {
                executions: Vec::new(),
                next_cursor: None,
            });
        };
        let page_size = query.limit;
        // One more than the page: whether there is a next page, without a count.
        query.limit = page_size + 1;
        let mut executions = self
            .store
            .executions(&caller, &query)
            .await
            .map_err(|error| unavailable(&error))?;
        let next_cursor = if executions.len() > page_size {
            executions.truncate(page_size);
            executions.last().map(|last| last.execution_id.to_string())
        } else {
            None
        };
        Ok(Page {
            executions,
            next_cursor,
        })
    }

    /// The execution's events after `after` (recorded, then live), ending with its end; `None`
    /// when it is not the caller's.
    pub(crate) async fn events(
        &self,
        principal: &Principal,
        execution_id: &str,
        after: u64,
    ) -> Result<Option<impl Stream<Item = ReplayedEvent> + Send + 'static>, ToolError> {
        let Some(record) = self.lookup(principal, execution_id).await? else {
            return Ok(None);
        };
        let Some(caller) = self.owner(principal) else {
            return Ok(None);
        };
        let follow = Follow {
            store: Arc::clone(&self.store),
            caller,
            execution_id: record.execution_id,
            after,
            done: false,
        };
        let batches = futures_util::stream::unfold(follow, |mut follow| async move {
            let batch = follow.next_batch().await?;
            Some((futures_util::stream::iter(batch), follow))
        });
        Ok(Some(futures_util::StreamExt::flatten(batches)))
    }
}

/// A reader following one execution's events.
struct Follow {
    store: Arc<dyn ExecutionStore>,
    caller: Arc<str>,
    execution_id: Arc<str>,
    /// The id of the last event sent.
    after: u64,
    done: bool,
}

impl Follow {
    /// The next events, waiting for some; `None` once the end was sent (or the execution is
    /// gone, or the store fails: the client reconnects with `Last-Event-ID`).
    async fn next_batch(&mut self) -> Option<Vec<ReplayedEvent>> {
        while !self.done {
            // Watch before reading: a change after the read is not missed.
            let changed = self.store.execution_changed(&self.execution_id);
            let record = match self.store.execution(&self.caller, &self.execution_id).await {
                Ok(Some(record)) => record,
                Ok(None) => return None,
                Err(error) => {
                    tracing::warn!(%error, "could not follow an execution's events");
                    return None;
                }
            };
            self.done = record.outcome.is_some();
            let batch = self.unsent(&record);
            if !batch.is_empty() {
                return Some(batch);
            }
            if !self.done {
                changed.await;
            }
        }
        None
    }

    /// The record's events after the last one sent.
    fn unsent(&mut self, record: &ExecutionRecord) -> Vec<ReplayedEvent> {
        let mut events = Vec::new();
        if self.after < STARTED_EVENT_ID {
            events.push(ReplayedEvent {
                id: STARTED_EVENT_ID,
                name: "execution.started",
                data: response::started_data(&record.execution_id, &record.tool),
            });
        }
        events.extend(
            record
                .progress
                .iter()
                .filter(|event| event.id > self.after)
                .map(|event| ReplayedEvent {
                    id: event.id,
                    name: "tool.progress",
                    data: String::from_utf8_lossy(&event.data).into_owned(),
                }),
        );
        if let Some(outcome) = &record.outcome
            && outcome.event_id > self.after
        {
            events.push(ReplayedEvent {
                id: outcome.event_id,
                name: "execution.completed",
                data: response::with_replayed(&outcome.response.body, false),
            });
        }
        if let Some(last) = events.last() {
            self.after = last.id;
        }
        events
    }
}

/// The body of a running execution: `{"execution_id", "tool", "status": "running",
/// "progress"?, "created_at"}`; also the body of a `202`.
pub(crate) fn running_body(execution_id: &str, tool: &str, progress: Option<&Bytes>) -> Bytes {
    let mut body = serde_json::Map::new();
    body.insert("execution_id".into(), json!(execution_id));
    body.insert("tool".into(), json!(tool));
    body.insert("status".into(), json!(ExecutionState::Running.as_str()));
    if let Some(Value::Object(mut latest)) =
        progress.and_then(|data| serde_json::from_slice::<Value>(data).ok())
    {
        latest.remove("execution_id");
        body.insert("progress".into(), Value::Object(latest));
    }
    body.insert("created_at".into(), json!(created_at(execution_id)));
    Bytes::from(serde_json::to_vec(&body).expect("a running body serializes"))
}

/// Whether `text` is an execution id: `exec_` and a UUID.
pub(crate) fn is_execution_id(text: &str) -> bool {
    text.strip_prefix("exec_")
        .is_some_and(|uuid| uuid::Uuid::try_parse(uuid).is_ok())
}

/// A store failure, answered as a retryable `503`.
fn unavailable(error: &StoreError) -> ToolError {
    tracing::error!(%error, "the store failed to answer about executions");
    ToolError::capacity(
        codes::IDEMPOTENCY_UNAVAILABLE,
        "the idempotency store is unavailable",
    )
    .retryable(Duration::from_secs(1))
}
