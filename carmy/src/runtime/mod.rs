//! The execution pipeline, shared by every transport; it knows nothing of HTTP.
//!
//! resolve the tool → gate (confirmation) → validate the arguments → reserve the idempotency
//! key → take an in-flight slot → run under the deadline and the cancellation token, catching
//! panics → serialize → record → answer.

mod answer;
mod detached;
mod fingerprint;
mod in_flight;
mod invoke;
mod journal;
mod perform;
mod prepare;
mod repeated;
mod reserve;
pub(crate) mod response;
pub(crate) mod validation;

use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::catalog::Catalog;
use crate::context::{
    CancelOnExit, Context, Event, EventReceiver, EventSender, Requester, journal_channel,
};
use crate::error::Error;
use crate::health::Health;
use crate::principal::{Principal, TrustLevel};
use crate::reload::Reloads;
use crate::state::StateMap;
pub(crate) use crate::status::ExecutionStatus;
use crate::store::{
    ExecutionStore, Fingerprint, Finish, IdempotencyKey, KEPT_PROGRESS, RecordedEvent,
    RecordedOutcome, Reservation, StoredResponse, Stores,
};
use crate::telemetry::{self, Active, Metrics};
use crate::tool::{CallFuture, Confirmation, Invocation, Mode, ToolDescriptor};
use crate::tool_error::{Category, ToolError, clip};
use crate::wire::codes;
use answer::*;
use in_flight::{InFlight, Slot};
pub(crate) use invoke::poll_once;
use invoke::*;
pub(crate) use journal::STARTED_EVENT_ID;
use journal::*;
use repeated::Repeated;
use reserve::*;
use response::NextAction;

/// How the runtime is tuned; set through the [`App`](crate::App) builder.
#[derive(Debug, Clone)]
pub(crate) struct RuntimeOptions {
    pub(crate) default_timeout: Duration,
    pub(crate) max_in_flight: usize,
    /// The most executions one caller may run at once; `None`: half of `max_in_flight`.
    pub(crate) max_in_flight_per_caller: Option<usize>,
    pub(crate) record_ttl: Duration,
    /// Whether executions are counted for `/metrics`.
    pub(crate) metrics: bool,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            default_timeout: Duration::from_secs(30),
            max_in_flight: 1_024,
            max_in_flight_per_caller: None,
            record_ttl: Duration::from_secs(24 * 60 * 60),
            metrics: false,
        }
    }
}

/// How long a reservation outlives the execution's deadline: time to record the outcome.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// Refuses a record ttl that a running execution could outlive: its record would expire while it
/// runs, and a retry would run the tool a second time.
pub(crate) fn check_record_ttl(catalog: &Catalog, settings: &RuntimeOptions) -> Result<(), Error> {
    for tool in catalog.tools() {
        let descriptor = tool.descriptor;
        let lease = tool.timeout.unwrap_or(settings.default_timeout) + LEASE_MARGIN;
        if settings.record_ttl < lease {
            return Err(Error::TtlShorterThanDeadline {
                tool: descriptor.name.to_owned(),
                location: descriptor.location(),
                ttl: settings.record_ttl,
                lease,
            });
        }
    }
    Ok(())
}

/// What a transport asks the runtime to run.
#[derive(Debug)]
pub(crate) struct Call {
    /// The catalog of the configuration snapshot the request started with.
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) tool: String,
    pub(crate) arguments: Value,
    /// Already checked with [`check_request_id`].
    pub(crate) request_id: Option<String>,
    pub(crate) principal: Principal,
    pub(crate) requester: Requester,
}

/// How a call was answered.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) response: StoredResponse,
    /// The response was recorded by an earlier call with the same `request_id`.
    pub(crate) replayed: bool,
    /// When to retry, for errors that say so.
    pub(crate) retry_after: Option<Duration>,
}

/// How a transport wants a call delivered.
#[derive(Debug)]
pub(crate) struct Delivery {
    /// Fired when the client goes away; ignored by an execution that runs detached. `None`:
    /// the future of the call stands for the client, which cancels by dropping it.
    pub(crate) cancel: Option<CancellationToken>,
    /// Where a streaming transport wants the events.
    pub(crate) events: Option<EventSender>,
    /// The client asked for an asynchronous answer (`Prefer: respond-async`).
    pub(crate) prefer_async: bool,
}

/// What a call was answered with.
#[derive(Debug)]
pub(crate) enum Answer {
    /// The answer itself.
    Outcome(Outcome),
    /// The execution runs detached; its caller reads it back by id (`protocol.md` §9).
    Accepted(Accepted),
}

/// An execution that was started detached (or was already running for the same request).
#[derive(Debug, Clone)]
pub(crate) struct Accepted {
    pub(crate) execution_id: Arc<str>,
    pub(crate) tool: &'static str,
}

/// A `request_id` is 1–256 bytes of printable ASCII.
pub(crate) fn check_request_id(request_id: &str) -> Result<(), ToolError> {
    if (1..=256).contains(&request_id.len())
        && request_id.bytes().all(|byte| (0x20..=0x7e).contains(&byte))
    {
        Ok(())
    } else {
        Err(ToolError::invalid_request(
            "request_id must be 1 to 256 bytes of printable ASCII",
        ))
    }
}

/// The execution pipeline of one app.
pub(crate) struct Runtime {
    states: Arc<StateMap>,
    stores: Stores,
    settings: RuntimeOptions,
    in_flight: Arc<InFlight>,
    /// One lock per tool declared `parallel_safe = false`.
    serial: HashMap<&'static str, Arc<Mutex<()>>>,
    /// Fired to cancel every execution (the end of a graceful shutdown).
    shutdown: CancellationToken,
    tasks: TaskTracker,
    logs: StoreLogs,
    health: Health,
    /// `None` when metrics are off: nothing is counted.
    metrics: Option<Arc<Metrics>>,
    /// Where `execution.finished` goes (`protocol.md` §8).
    #[cfg(feature = "events")]
    events: Option<Arc<crate::events::Events>>,
}

/// One rate limit per log line about the store: an outage fails every call.
#[derive(Debug, Default)]
struct StoreLogs {
    reserve: Repeated,
    record: Repeated,
    release: Repeated,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A call that passed the checks that need no record: ready to reserve and run.
struct Prepared {
    execution_id: Arc<str>,
    tool: &'static ToolDescriptor,
    arguments: Arc<Value>,
    /// Shared by the idempotency key and the tool's context.
    request_id: Option<Arc<str>>,
    principal: Principal,
    requester: Requester,
    idempotency: Option<(IdempotencyKey, Fingerprint)>,
    /// The tool's deadline in this snapshot: `carmy.toml`'s override, else the declared one,
    /// else the default.
    timeout: Duration,
    deadline: Instant,
    /// The execution is kept for its caller (`protocol.md` §9).
    kept: bool,
    /// It runs detached from the connection and is answered with `202`.
    detached: bool,
}

impl Prepared {
    /// When the reservation's lease ends: the deadline and the margin to record the outcome.
    fn lease_end(&self) -> Instant {
        self.deadline + LEASE_MARGIN
    }
}

/// A call once begun: how its outcome comes.
enum Begun {
    /// Answered without waiting.
    Ended(Outcome),
    /// An execution without a record whose tool waits: it goes on in the caller's future.
    Waiting(Pin<Box<dyn Future<Output = Outcome> + Send>>),
    /// An execution with a record whose tool waits, in a task of its own; `client_gone`
    /// cancels it when the caller's future is dropped.
    Running {
        task: tokio::task::JoinHandle<Outcome>,
        client_gone: Option<DropGuard>,
    },
    /// A detached execution, being started.
    Starting(Pin<Box<dyn Future<Output = Result<Accepted, Outcome>> + Send>>),
}

/// What a call's span and metrics need once it has ended.
struct Traced {
    span: tracing::Span,
    started: Instant,
    tool: Option<&'static str>,
    execution_id: Arc<str>,
}

/// A call refused before it could run, with what the suggestions need.
struct Rejected {
    error: ToolError,
    tool: String,
    /// The catalog's name of the tool, when the caller may see it.
    known: Option<&'static str>,
    arguments: Value,
}

/// What an execution ended with: a serialized output, or an error.
enum Ended {
    Output(bytes::Bytes),
    Error(ToolError),
}

/// What the reservation of an idempotency key came to.
enum Claim {
    /// The key is this execution's: run.
    Reserved,
    /// The call is answered already (a replay, a conflict, a wait that ended without one).
    Answered(Outcome),
    /// The same call runs as this execution (reported instead of waiting, for async calls).
    HeldBy(Arc<str>),
}

/// How running the tool ended.
enum Ran {
    Output(crate::tool::Output),
    Error(ToolError),
    Panicked,
    Cancelled,
    TimedOut,
}

impl Runtime {
    /// A runtime for the tools of `catalog` (every tool, before any override).
    pub(crate) fn new(
        catalog: &Catalog,
        states: StateMap,
        stores: Stores,
        settings: RuntimeOptions,
        health: Health,
        reloads: &Reloads,
    ) -> Self {
        let metrics = settings.metrics.then(|| Arc::new(Metrics::new(reloads)));
        let serial = catalog
            .tools()
            .iter()
            .filter(|tool| !tool.descriptor.parallel_safe)
            .map(|tool| (tool.descriptor.name, Arc::new(Mutex::new(()))))
            .collect();
        Runtime {
            states: Arc::new(states),
            stores,
            in_flight: Arc::new(InFlight::new(
                settings.max_in_flight,
                settings
                    .max_in_flight_per_caller
                    .unwrap_or(settings.max_in_flight / 2),
            )),
            settings,
            serial,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            logs: StoreLogs::default(),
            health,
            metrics,
            #[cfg(feature = "events")]
            events: None,
        }
    }

    /// Publishes `execution.finished` for every async execution and every one with a
    /// `request_id`, before it is answered.
    #[cfg(feature = "events")]
    pub(crate) fn publish_to(&mut self, events: Arc<crate::events::Events>) {
        self.events = Some(events);
    }

    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// The app's metrics, when they are on.
    pub(crate) fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    /// How long a finished execution's record is kept.
    #[cfg(feature = "mcp")]
    pub(crate) fn record_ttl(&self) -> Duration {
        self.settings.record_ttl
    }

    /// Where executions are kept for their callers (`protocol.md` §9).
    pub(crate) fn execution_store(&self) -> &Arc<dyn ExecutionStore> {
        &self.stores.executions
    }

    /// Cancels every execution still running.
    pub(crate) fn cancel_all(&self) {
        self.shutdown.cancel();
    }

    /// Fires with [`Runtime::cancel_all`]: transports end their long-lived streams then, and
    /// the event worker stops.
    #[cfg(any(feature = "mcp", feature = "events"))]
    pub(crate) fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.child_token()
    }

    /// Runs `work` in a task of its own that [`Runtime::wait_idle`] waits for: a transport's
    /// call that outlives its client.
    #[cfg(feature = "mcp")]
    pub(crate) fn spawn<F>(&self, work: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(work)
    }

    /// Waits until every execution has finished and recorded its outcome.
    pub(crate) async fn wait_idle(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }

    /// Runs `call` and waits for its answer: for transports without asynchronous answers. An
    /// execution that runs detached anyway (a `mode = "async"` tool) is waited for here.
    pub(crate) async fn execute(
        self: &Arc<Self>,
        call: Call,
        cancel: CancellationToken,
        events: Option<EventSender>,
    ) -> Outcome {
        let principal = call.principal.clone();
        let delivery = Delivery {
            cancel: Some(cancel),
            events,
            prefer_async: false,
        };
        match self.call(call, delivery).await {
            Answer::Outcome(outcome) => outcome,
            Answer::Accepted(accepted) => self.wait_for(&principal, &accepted).await,
        }
    }

    /// Runs `call`: the one pipeline of every transport. Firing `delivery.cancel` (the client
    /// went away) cancels a synchronous execution; its outcome is still recorded, because an
    /// execution with a record runs in its own task. A detached one is answered at once.
    ///
    /// A plain function that does all it can at once (prepare, and run a tool that does not
    /// wait) and returns a future of what is left: an async function's future would also keep
    /// its arguments and every step's locals, several hundred bytes that each caller's future
    /// carries and moves. The future owns what it needs, so a caller can make it and let go of
    /// what the call was made from.
    pub(crate) fn call(
        self: &Arc<Self>,
        call: Call,
        delivery: Delivery,
    ) -> impl Future<Output = Answer> + Send + use<> {
        let (begun, traced) = self.begin(call, delivery);
        let metrics = self.metrics.clone();
        async move {
            let outcome = match begun {
                Begun::Ended(outcome) => outcome,
                Begun::Waiting(waiting) => waiting.instrument(traced.span.clone()).await,
                Begun::Running { task, client_gone } => {
                    let outcome = match task.await {
                        Ok(outcome) => outcome,
                        Err(join_error) => {
                            tracing::error!(parent: &traced.span, error = %join_error, "execution task failed");
                            let error = ToolError::internal(codes::INTERNAL, "internal error");
                            let execution_id = &traced.execution_id;
                            answer_error(execution_id, ExecutionStatus::Failed, &error, &[])
                        }
                    };
                    if let Some(client_gone) = client_gone {
                        client_gone.disarm();
                    }
                    outcome
                }
                Begun::Starting(start) => {
                    return match start.await {
                        Ok(accepted) => Answer::Accepted(accepted),
                        Err(outcome) => {
                            record_span(&traced.span, &outcome, traced.started.elapsed());
                            Answer::Outcome(outcome)
                        }
                    };
                }
            };
            let elapsed = traced.started.elapsed();
            record_span(&traced.span, &outcome, elapsed);
            count_answer(metrics.as_deref(), traced.tool, &outcome, elapsed);
            Answer::Outcome(outcome)
        }
    }

    /// The part of [`Runtime::call`] that needs no waiting.
    fn begin(self: &Arc<Self>, call: Call, delivery: Delivery) -> (Begun, Traced) {
        let Delivery {
            cancel,
            events,
            prefer_async,
        } = delivery;
        let execution_id = new_execution_id();
        let span = telemetry::execution_span(&execution_id, call.request_id.as_deref(), &call.tool);
        let started = Instant::now();
        let prepared = self.prepare(call, execution_id.clone(), prefer_async, started);
        // The catalog's name, for the metrics' label: never the caller's text, and none for a
        // tool hidden from the caller, which to them does not exist.
        let tool = match &prepared {
            Ok(prepared) => Some(prepared.tool.name),
            Err(rejected) => rejected.known,
        };
        let begun = match prepared {
            Err(rejected) => {
                let _entered = span.enter();
                Begun::Ended(self.answer_rejection(&execution_id, &rejected, events.as_ref()))
            }
            Ok(prepared) if prepared.detached => {
                span.record("effect", prepared.tool.effect.as_str());
                Begun::Starting(Box::pin(Arc::clone(self).start(
                    prepared,
                    span.clone(),
                    started,
                )))
            }
            // Without a record, the execution runs in the caller's future: if the client goes
            // away, dropping it cancels the tool.
            Ok(prepared) if prepared.idempotency.is_none() && !prepared.kept => {
                span.record("effect", prepared.tool.effect.as_str());
                let _entered = span.enter();
                match self.perform_unrecorded(prepared, cancel, events) {
                    Ok(outcome) => Begun::Ended(outcome),
                    Err(waiting) => Begun::Waiting(waiting),
                }
            }
            // With one, the execution runs in its own task so its outcome is recorded even if
            // the client goes away; unless it is recorded before it ever waits.
            Ok(prepared) => {
                span.record("effect", prepared.tool.effect.as_str());
                // Without a token of the client's, the caller's future stands for the client:
                // the task sees it dropped.
                let (cancel, client_gone) = match cancel {
                    Some(cancel) => (cancel, None),
                    None => {
                        let cancel = CancellationToken::new();
                        let client_gone = cancel.clone().drop_guard();
                        (cancel, Some(client_gone))
                    }
                };
                let run = Arc::clone(self)
                    .run(prepared, cancel, events)
                    .instrument(span.clone());
                match poll_once(run) {
                    Ok(outcome) => {
                        // Ended: nothing is left to cancel.
                        if let Some(client_gone) = client_gone {
                            client_gone.disarm();
                        }
                        Begun::Ended(outcome)
                    }
                    Err(waiting) => Begun::Running {
                        task: self.tasks.spawn(waiting),
                        client_gone,
                    },
                }
            }
        };
        let traced = Traced {
            span,
            started,
            tool,
            execution_id,
        };
        (begun, traced)
    }
}
