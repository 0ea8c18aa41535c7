//! The execution pipeline, shared by every transport; it knows nothing of HTTP.
//!
//! resolve the tool → gate (confirmation) → validate the arguments → reserve the idempotency
//! key → take an in-flight slot → run under the deadline and the cancellation token, catching
//! panics → serialize → record → answer.

mod fingerprint;
mod in_flight;
mod repeated;
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
use in_flight::{InFlight, Slot};
use repeated::Repeated;
use response::NextAction;

/// How the runtime is tuned; set through the [`App`](crate::App) builder.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) default_timeout: Duration,
    pub(crate) max_in_flight: usize,
    /// The most executions one caller may run at once; `None`: half of `max_in_flight`.
    pub(crate) max_in_flight_per_caller: Option<usize>,
    pub(crate) record_ttl: Duration,
    /// Whether executions are counted for `/metrics`.
    pub(crate) metrics: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
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
pub(crate) fn check_record_ttl(catalog: &Catalog, settings: &Settings) -> Result<(), Error> {
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
    settings: Settings,
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
        settings: Settings,
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

    /// Starts `prepared` detached from the connection: reserve, take a slot, keep the
    /// execution, then run it in its own task under its deadline. `Err`: answered at once (a
    /// replay, a conflict, no capacity).
    async fn start(
        self: Arc<Self>,
        prepared: Prepared,
        span: tracing::Span,
        started: Instant,
    ) -> Result<Accepted, Outcome> {
        // Nobody's connection: only the store (a DELETE) or a shutdown cancels it.
        let cancel = CancellationToken::new();
        if let Some((key, fingerprint)) = &prepared.idempotency {
            match self
                .reserve(&prepared, key, fingerprint, &cancel, None, false)
                .instrument(span.clone())
                .await
            {
                Claim::Reserved => {}
                Claim::Answered(outcome) => return Err(outcome),
                Claim::HeldBy(execution_id) => {
                    return Ok(Accepted {
                        execution_id,
                        tool: prepared.tool.name,
                    });
                }
            }
        }
        let slot = self.admit(&prepared, None).instrument(span.clone()).await?;
        let accepted = Accepted {
            execution_id: prepared.execution_id.clone(),
            tool: prepared.tool.name,
        };
        let runtime = Arc::clone(&self);
        self.tasks.spawn(
            async move {
                let tool = prepared.tool.name;
                let outcome = runtime.perform(&prepared, slot, &cancel, None).await;
                let elapsed = started.elapsed();
                record_span(&tracing::Span::current(), &outcome, elapsed);
                count_answer(runtime.metrics.as_deref(), Some(tool), &outcome, elapsed);
            }
            .instrument(span),
        );
        Ok(accepted)
    }

    /// The answer of a detached execution, once it has ended (read back from the store).
    async fn wait_for(&self, principal: &Principal, accepted: &Accepted) -> Outcome {
        loop {
            let changed = self
                .stores
                .executions
                .execution_changed(&accepted.execution_id);
            match self
                .stores
                .executions
                .execution(principal.id(), &accepted.execution_id)
                .await
            {
                Ok(Some(record)) => {
                    if let Some(ended) = record.outcome {
                        return Outcome {
                            response: ended.response,
                            replayed: false,
                            retry_after: None,
                        };
                    }
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::error!(%error, "could not read a detached execution back");
                    let error = ToolError::capacity(
                        codes::IDEMPOTENCY_UNAVAILABLE,
                        "the idempotency store is unavailable",
                    )
                    .retryable(Duration::from_secs(1));
                    return answer_error(
                        &accepted.execution_id,
                        ExecutionStatus::Failed,
                        &error,
                        &[],
                    );
                }
            }
            changed.await;
        }
    }

    /// The checks that need no record: resolve, gate, validate. On failure, returns the error
    /// and the arguments (for the suggestions).
    fn prepare(
        &self,
        call: Call,
        execution_id: Arc<str>,
        prefer_async: bool,
        started: Instant,
    ) -> Result<Prepared, Rejected> {
        let Call {
            catalog,
            tool,
            arguments,
            request_id,
            principal,
            requester,
        } = call;
        let Some(entry) = catalog.get_visible(&tool, principal.trust()) else {
            let error = tool_not_found(&catalog, &tool, principal.trust());
            return Err(Rejected {
                error,
                tool,
                known: None,
                arguments,
            });
        };
        let descriptor = entry.descriptor;
        if descriptor.confirmation == Confirmation::Required
            && !principal.has_permission(&format!("confirm:{}", descriptor.name))
        {
            let error = ToolError::permission(
                codes::CONFIRMATION_REQUIRED,
                format!("`{}` needs the user's confirmation", descriptor.name),
            )
            .recoverable(true)
            .details(json!({ "permission": format!("confirm:{}", descriptor.name) }));
            return Err(Rejected {
                error,
                tool,
                known: Some(descriptor.name),
                arguments,
            });
        }
        if let Some(error) = validation::check(entry, &arguments) {
            return Err(Rejected {
                error,
                tool,
                known: Some(descriptor.name),
                arguments,
            });
        }
        let request_id: Option<Arc<str>> = request_id.map(Arc::from);
        let idempotency = request_id.as_ref().map(|request_id| {
            (
                IdempotencyKey::new(principal.shared_id(), Arc::clone(request_id)),
                fingerprint::fingerprint(&entry.name, &arguments),
            )
        });
        let timeout = entry.timeout.unwrap_or(self.settings.default_timeout);
        // Executions belong to an identified caller: an anonymous one could not be read back
        // by its caller alone.
        let keepable = principal.trust() != TrustLevel::Anonymous;
        let detached = keepable
            && match descriptor.mode {
                Mode::Async => true,
                Mode::Sync => false,
                Mode::Either => prefer_async,
            };
        let kept = keepable && (detached || idempotency.is_some());
        Ok(Prepared {
            execution_id,
            tool: descriptor,
            arguments: Arc::new(arguments),
            request_id,
            principal,
            requester,
            idempotency,
            timeout,
            // From the call's start, read once for its duration too.
            deadline: started + timeout,
            kept,
            detached,
        })
    }

    /// Reserve → run → record. Runs in its own task so the record is written even when the
    /// client is gone.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn's future would be larger"
    )]
    fn run(
        self: Arc<Self>,
        prepared: Prepared,
        cancel: CancellationToken,
        events: Option<EventSender>,
    ) -> impl Future<Output = Outcome> + Send + use<> {
        // An async block rather than an async fn, whose future keeps a second copy of its
        // arguments: this one is boxed for every call with a `request_id`.
        async move {
            if let Some((key, fingerprint)) = &prepared.idempotency {
                match self
                    .reserve(&prepared, key, fingerprint, &cancel, events.as_ref(), true)
                    .await
                {
                    Claim::Reserved => {}
                    Claim::Answered(outcome) => return outcome,
                    Claim::HeldBy(execution_id) => {
                        // Only an async start asks not to wait; a synchronous call always waits.
                        tracing::error!(%execution_id, "a synchronous call did not wait");
                        let error = ToolError::internal(codes::INTERNAL, "internal error");
                        return answer_error(
                            &prepared.execution_id,
                            ExecutionStatus::Failed,
                            &error,
                            &[],
                        );
                    }
                }
            }
            let slot = match self.admit(&prepared, events.as_ref()).await {
                Ok(slot) => slot,
                Err(outcome) => return outcome,
            };
            self.perform(&prepared, slot, &cancel, events.as_ref())
                .await
        }
    }

    /// Takes an in-flight slot and, for a kept execution, keeps it in the store: visible to
    /// its caller from now on. `Err`: the answer (no capacity, the store failed).
    async fn admit(
        &self,
        prepared: &Prepared,
        events: Option<&EventSender>,
    ) -> Result<Slot, Outcome> {
        let Some(slot) = self.slot(&prepared.principal) else {
            if let Some((key, _)) = &prepared.idempotency {
                self.release(prepared, key).await;
            }
            return Err(self.overloaded(prepared, events));
        };
        if prepared.kept {
            let lease = prepared.deadline.saturating_duration_since(Instant::now()) + LEASE_MARGIN;
            if let Err(store_error) = self
                .stores
                .executions
                .begin_execution(
                    prepared.principal.id(),
                    &prepared.execution_id,
                    prepared.tool.name,
                    lease,
                )
                .await
            {
                if let Some((key, _)) = &prepared.idempotency {
                    self.release(prepared, key).await;
                }
                return Err(self.store_failed(prepared, &store_error, events));
            }
        }
        Ok(slot)
    }

    /// An in-flight slot for `principal`, if one is free and the caller holds less than its
    /// share.
    fn slot(&self, principal: &Principal) -> Option<Slot> {
        self.in_flight.take(principal)
    }

    /// The answer when every in-flight slot is taken, or the caller's share of them.
    fn overloaded(&self, prepared: &Prepared, events: Option<&EventSender>) -> Outcome {
        let error = ToolError::capacity(codes::OVERLOADED, "too many executions in flight")
            .retryable(Duration::from_secs(1));
        self.answer_failure(prepared, ExecutionStatus::Failed, &error, events)
    }

    /// Runs an execution without a record, the common call, as one function while it can: a
    /// tool that ends on its first poll (most do) is answered without a timer, a cancellation
    /// waiter or a future for each step of the pipeline. `Err`: the tool waits (or is serial,
    /// and waits for its turn first), and the rest runs in the future returned, under the
    /// deadline and the cancellation tokens.
    fn perform_unrecorded(
        self: &Arc<Self>,
        prepared: Prepared,
        cancel: Option<CancellationToken>,
        events: Option<EventSender>,
    ) -> Result<Outcome, Pin<Box<dyn Future<Output = Outcome> + Send>>> {
        let Some(slot) = self.slot(&prepared.principal) else {
            return Ok(self.overloaded(&prepared, events.as_ref()));
        };
        emit_started(events.as_ref(), &prepared.execution_id, prepared.tool.name);
        let running = self.metrics.as_deref().map(Metrics::execution_running);
        let (mut call, cancel_on_exit) = self.invocation(&prepared, events.as_ref());
        let serial = self.serial.get(prepared.tool.name).cloned();
        if serial.is_none()
            && let Some(ended) = first_poll(&mut call)
        {
            // The tool's future first: the guard then sees whether anything else kept the
            // context.
            drop((call, cancel_on_exit, running, slot));
            return Ok(self.outcome_of(&prepared, ran(ended), events.as_ref()).0);
        }
        // The gauge borrows the runtime: the future takes a count of its own.
        drop(running);
        let runtime = Arc::clone(self);
        Err(Box::pin(async move {
            let running = runtime.metrics.as_deref().map(Metrics::execution_running);
            let work = serialized(serial, call);
            let ran = runtime
                .interruptible(work, cancel.as_ref(), prepared.deadline)
                .await;
            drop((cancel_on_exit, running, slot));
            runtime.outcome_of(&prepared, ran, events.as_ref()).0
        }))
    }

    /// Runs the admitted execution and records how it ended.
    async fn perform(
        &self,
        prepared: &Prepared,
        _slot: Slot,
        cancel: &CancellationToken,
        events: Option<&EventSender>,
    ) -> Outcome {
        emit_started(events, &prepared.execution_id, prepared.tool.name);
        let running = self.metrics.as_deref().map(Metrics::execution_running);
        let outcome = if prepared.kept {
            // Boxed: its journal and its watch on the store would make the future of every
            // call that records an outcome several times as large.
            Box::pin(self.perform_kept(prepared, running, cancel, events)).await
        } else {
            let ran = self.invoke(prepared, cancel, events).await;
            drop(running);
            self.conclude(prepared, ran, events).await
        };
        self.finished(prepared, &outcome).await;
        outcome
    }

    /// Runs a kept execution: its events go to the store (any replica replays them) and on
    /// to a client streaming this call; a cancellation request through the store cancels it.
    /// `running` counts it in flight until the tool has ended.
    async fn perform_kept(
        &self,
        prepared: &Prepared,
        running: Option<Active<'_>>,
        cancel: &CancellationToken,
        events: Option<&EventSender>,
    ) -> Outcome {
        let (recorder, recorded) = journal_channel(KEPT_PROGRESS);
        let mut journal = Journal {
            store: Arc::clone(&self.stores.executions),
            execution_id: prepared.execution_id.clone(),
            events: recorded,
            forward: events.cloned(),
            next_id: FIRST_PROGRESS_ID,
        };
        let requested = cancellation_requested(
            Arc::clone(&self.stores.executions),
            prepared.principal.shared_id(),
            prepared.execution_id.clone(),
        );
        let ran = tokio::select! {
            biased;
            ran = self.invoke(prepared, cancel, Some(&recorder)) => ran,
            () = requested => Ran::Cancelled,
            () = journal.write_forever() => unreachable!("the journal waits for events forever"),
        };
        drop(running);
        journal.write_waiting().await;
        let outcome = self.conclude(prepared, ran, events).await;
        let ended = RecordedOutcome {
            response: outcome.response.clone(),
            event_id: journal.next_id,
        };
        let ttl = self.settings.record_ttl;
        let attempt = || {
            self.stores
                .executions
                .end_execution(&prepared.execution_id, ended.clone(), ttl)
        };
        if let Err(error) = with_backoff(attempt, prepared.lease_end()).await
            && let Some(held_back) = self.logs.record.admit()
        {
            tracing::error!(
                error = %error,
                "could not record how a kept execution ended{}",
                repeated::summary(held_back)
            );
        }
        outcome
    }

    /// `execution.finished`, for an execution with a record: async, or with a `request_id`
    /// (anonymous callers' too).
    #[cfg_attr(not(feature = "events"), allow(clippy::unused_async))]
    async fn finished(&self, prepared: &Prepared, outcome: &Outcome) {
        #[cfg(feature = "events")]
        if let Some(events) = &self.events
            && (prepared.kept || prepared.idempotency.is_some())
        {
            // Built only when some subscription takes the event.
            let data = || {
                serde_json::json!({
                    "execution_id": &*prepared.execution_id,
                    "tool": prepared.tool.name,
                    "status": outcome.response.status.as_str(),
                    "caller": prepared.principal.id(),
                })
            };
            events
                .publish(crate::events::EventType::ExecutionFinished, data)
                .await;
        }
        #[cfg(not(feature = "events"))]
        let _ = (prepared, outcome);
    }

    /// Claims the idempotency key. A duplicate of a running call waits for it when `wait`,
    /// and is told which execution runs it otherwise.
    async fn reserve(
        &self,
        prepared: &Prepared,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        cancel: &CancellationToken,
        events: Option<&EventSender>,
        wait: bool,
    ) -> Claim {
        loop {
            // The claim outlives the deadline by a margin, so that only an execution that
            // will never record its outcome (its process died) lets the lease pass.
            let lease = prepared.deadline.saturating_duration_since(Instant::now()) + LEASE_MARGIN;
            let reservation = self
                .stores
                .keys
                .reserve(
                    key,
                    fingerprint,
                    &prepared.execution_id,
                    lease,
                    self.settings.record_ttl,
                )
                .await;
            let error = match reservation {
                Ok(Reservation::Reserved) => return Claim::Reserved,
                Ok(Reservation::Finished(response)) => {
                    emit_started(events, &response.execution_id, prepared.tool.name);
                    return Claim::Answered(Outcome {
                        response,
                        replayed: true,
                        retry_after: None,
                    });
                }
                Ok(Reservation::Running { execution_id, .. }) if !wait && prepared.kept => {
                    return Claim::HeldBy(execution_id);
                }
                Ok(Reservation::Running { changed, .. }) => {
                    // Boxed, with its timer and waiter: only a duplicate waits here.
                    let waited = Box::pin(async {
                        tokio::select! {
                            () = changed => None,
                            () = cancel.cancelled() => {
                                let error = ToolError::cancelled(codes::CANCELLED, "the call was cancelled while waiting for the same request")
                                    .retryable(None);
                                Some(self.answer_failure(prepared, ExecutionStatus::Cancelled, &error, events))
                            }
                            () = tokio::time::sleep_until(prepared.deadline) => {
                                let error = ToolError::timeout(codes::TIMEOUT, "the first call with this request_id is still running")
                                    .retryable(Duration::from_secs(1));
                                Some(self.answer_failure(prepared, ExecutionStatus::TimedOut, &error, events))
                            }
                        }
                    });
                    match waited.await {
                        None => continue,
                        Some(outcome) => return Claim::Answered(outcome),
                    }
                }
                Ok(Reservation::Conflict { tool }) => ToolError::conflict(
                    codes::IDEMPOTENCY_CONFLICT,
                    "this request_id was used for a different call",
                )
                .details(json!({ "tool": &*tool }))
                .recoverable(true),
                Ok(Reservation::Uncertain { execution_id }) => ToolError::conflict(
                    codes::EXECUTION_UNCERTAIN,
                    "an earlier execution with this request_id was interrupted; it may or may \
                     not have taken effect",
                )
                .details(json!({ "execution_id": &*execution_id }))
                .recoverable(false),
                Ok(Reservation::Full) => ToolError::capacity(
                    codes::IDEMPOTENCY_CAPACITY,
                    "too many executions with a request_id are running",
                )
                .retryable(Duration::from_secs(1)),
                Err(store_error) => {
                    return Claim::Answered(self.store_failed(prepared, &store_error, events));
                }
            };
            return Claim::Answered(self.answer_failure(
                prepared,
                ExecutionStatus::Failed,
                &error,
                events,
            ));
        }
    }

    /// The answer when the store fails: a retryable `503`, logged at a limited rate.
    fn store_failed(
        &self,
        prepared: &Prepared,
        store_error: &crate::store::StoreError,
        events: Option<&EventSender>,
    ) -> Outcome {
        if let Some(held_back) = self.logs.reserve.admit() {
            tracing::error!(
                error = %store_error,
                "idempotency store failed{}",
                repeated::summary(held_back)
            );
        }
        let error = ToolError::capacity(
            codes::IDEMPOTENCY_UNAVAILABLE,
            "the idempotency store is unavailable",
        )
        .retryable(Duration::from_secs(1));
        self.answer_failure(prepared, ExecutionStatus::Failed, &error, events)
    }

    /// Runs the tool under its deadline and the cancellation tokens, catching panics. A tool
    /// that waits goes on in a boxed future of its own, with the timer and the waiters: the
    /// future of a call whose tool ends on its first poll (most do) stays small.
    async fn invoke(
        &self,
        prepared: &Prepared,
        cancel: &CancellationToken,
        events: Option<&EventSender>,
    ) -> Ran {
        let (mut call, cancel_on_exit) = self.invocation(prepared, events);
        let serial = self.serial.get(prepared.tool.name).cloned();
        if serial.is_none()
            && let Some(ended) = first_poll(&mut call)
        {
            drop((call, cancel_on_exit));
            return ran(ended);
        }
        let work = serialized(serial, call);
        let ran = Box::pin(self.interruptible(work, Some(cancel), prepared.deadline)).await;
        drop(cancel_on_exit);
        ran
    }

    /// The tool's future, and the guard that cancels its context when dropped, however the
    /// execution ends (finished, cancelled, shut down, or dropped with its client).
    ///
    /// The context's token is its own, not a child of the shutdown token: a child would take
    /// the shutdown token's lock twice per call, for every call of the process; the shutdown
    /// is watched by [`Runtime::interruptible`] instead.
    fn invocation(
        &self,
        prepared: &Prepared,
        events: Option<&EventSender>,
    ) -> (CallFuture, CancelOnExit) {
        let context = Context::new(
            prepared.execution_id.clone(),
            prepared.request_id.clone(),
            prepared.principal.clone(),
            prepared.requester,
            events.cloned(),
            self.health.clone(),
        );
        let cancel_on_exit = context.cancel_on_exit();
        let invocation = Invocation {
            arguments: Arc::clone(&prepared.arguments),
            context,
            states: Arc::clone(&self.states),
        };
        ((prepared.tool.call)(invocation), cancel_on_exit)
    }

    /// Runs `work` until it ends, `cancel` fires (the client went away), the server shuts down
    /// or `deadline` passes. The tool's branch first: a tool that finishes on its first poll
    /// never registers the deadline's timer or the cancellation waiters.
    async fn interruptible(
        &self,
        work: impl Future<Output = ToolResult>,
        cancel: Option<&CancellationToken>,
        deadline: Instant,
    ) -> Ran {
        let client_gone = async {
            match cancel {
                Some(cancel) => cancel.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            result = work => ran(result),
            () = client_gone => Ran::Cancelled,
            () = self.shutdown.cancelled() => Ran::Cancelled,
            () = tokio::time::sleep_until(deadline) => Ran::TimedOut,
        }
    }

    /// Turns how the tool ended into the answer, and records it as the idempotency table says.
    async fn conclude(
        &self,
        prepared: &Prepared,
        ran: Ran,
        events: Option<&EventSender>,
    ) -> Outcome {
        let (outcome, kept) = self.outcome_of(prepared, ran, events);
        let Some((key, _)) = &prepared.idempotency else {
            return outcome;
        };
        match kept {
            Kept::Nothing => self.release(prepared, key).await,
            Kept::Uncertain => {
                let finish = Finish::Uncertain {
                    execution_id: &prepared.execution_id,
                };
                self.keep(key, finish, prepared.lease_end()).await;
            }
            Kept::Response => {
                let finish = Finish::Response(&outcome.response);
                self.keep(key, finish, prepared.lease_end()).await;
            }
        }
        outcome
    }

    /// How the tool ended, as the answer and what the idempotency table keeps of it.
    fn outcome_of(
        &self,
        prepared: &Prepared,
        ran: Ran,
        events: Option<&EventSender>,
    ) -> (Outcome, Kept) {
        let tool = prepared.tool;
        let safe_to_rerun = tool.idempotent || tool.effect.is_read_only();
        let (status, ended) = match ran {
            Ran::Output(output) => {
                let cacheable = tool.idempotent && tool.effect.is_read_only();
                let body = response::completed(&prepared.execution_id, &output.0, cacheable);
                (ExecutionStatus::Completed, Ended::Output(body))
            }
            Ran::Error(error) => {
                if error.category() == Category::Internal {
                    tracing::error!(code = error.code(), source = ?error.source(), "tool failed");
                }
                (ExecutionStatus::Failed, Ended::Error(error))
            }
            Ran::Panicked => (
                ExecutionStatus::Failed,
                Ended::Error(ToolError::internal(codes::TOOL_PANIC, "the tool panicked")),
            ),
            Ran::Cancelled => {
                let error = ToolError::cancelled(codes::CANCELLED, "the execution was cancelled");
                (
                    ExecutionStatus::Cancelled,
                    Ended::Error(interrupted(error, safe_to_rerun)),
                )
            }
            Ran::TimedOut => {
                let error =
                    ToolError::timeout(codes::TIMEOUT, "the execution ran past its deadline")
                        .details(json!({ "timeout_ms": prepared.timeout.as_millis() }));
                (
                    ExecutionStatus::TimedOut,
                    Ended::Error(interrupted(error, safe_to_rerun)),
                )
            }
        };
        match ended {
            Ended::Output(body) => {
                let outcome = Outcome {
                    response: StoredResponse {
                        execution_id: prepared.execution_id.clone(),
                        status,
                        category: None,
                        code: None,
                        body,
                    },
                    replayed: false,
                    retry_after: None,
                };
                (outcome, kept(status, false, false, safe_to_rerun))
            }
            Ended::Error(error) => {
                let kept = kept(
                    status,
                    error.is_rejected_before_running(),
                    error.is_retryable(),
                    safe_to_rerun,
                );
                (self.answer_failure(prepared, status, &error, events), kept)
            }
        }
    }

    /// The answer for a call refused before it could run.
    fn answer_rejection(
        &self,
        execution_id: &Arc<str>,
        rejected: &Rejected,
        events: Option<&EventSender>,
    ) -> Outcome {
        let Rejected {
            error,
            tool,
            arguments,
            known: _,
        } = rejected;
        emit_started(events, execution_id, tool);
        let next_actions = response::after_rejection(error, tool, arguments);
        answer_error(execution_id, ExecutionStatus::Failed, error, &next_actions)
    }

    /// The answer for a failure of `prepared`, with its suggestions.
    fn answer_failure(
        &self,
        prepared: &Prepared,
        status: ExecutionStatus,
        error: &ToolError,
        events: Option<&EventSender>,
    ) -> Outcome {
        emit_started(events, &prepared.execution_id, prepared.tool.name);
        let next_actions = response::after_failure(
            error,
            prepared.tool.name,
            &prepared.arguments,
            prepared.request_id.is_some(),
        );
        answer_error(&prepared.execution_id, status, error, &next_actions)
    }

    /// Records how the execution that reserved `key` ended. A store that fails is tried again
    /// with backoff before the call answers, until `lease_end` (while the record is still this
    /// execution's); the failure is logged once per call, and rate-limited across calls.
    async fn keep(&self, key: &IdempotencyKey, finish: Finish<'_>, lease_end: Instant) {
        let ttl = self.settings.record_ttl;
        let attempt = || self.stores.keys.finish(key, finish, ttl);
        if let Err(error) = with_backoff(attempt, lease_end).await
            && let Some(held_back) = self.logs.record.admit()
        {
            tracing::error!(
                error = %error,
                "could not record the outcome; the record stays running until its lease ends, \
                 then a retry with this request_id gets EXECUTION_UNCERTAIN{}",
                repeated::summary(held_back)
            );
        }
    }

    /// Frees `key` (nothing kept) if this execution still holds it, tried again like
    /// [`Runtime::keep`].
    async fn release(&self, prepared: &Prepared, key: &IdempotencyKey) {
        let attempt = || self.stores.keys.release(key, &prepared.execution_id);
        if let Err(error) = with_backoff(attempt, prepared.lease_end()).await
            && let Some(held_back) = self.logs.release.admit()
        {
            tracing::error!(
                error = %error,
                "could not release the request_id{}",
                repeated::summary(held_back)
            );
        }
    }
}

/// The SSE id of `execution.started`; progress events follow it.
pub(crate) const STARTED_EVENT_ID: u64 = 1;
const FIRST_PROGRESS_ID: u64 = STARTED_EVENT_ID + 1;

/// A kept execution's progress, numbered as the stream numbers it, written to the store and
/// passed on to the client streaming the call.
struct Journal {
    store: Arc<dyn ExecutionStore>,
    execution_id: Arc<str>,
    events: EventReceiver,
    forward: Option<EventSender>,
    /// The id after the last event written: `execution.completed`'s once the tool has ended.
    next_id: u64,
}

impl Journal {
    async fn write_forever(&mut self) {
        loop {
            let event = self.events.recv().await;
            self.write(event).await;
        }
    }

    /// Writes what the tool reported before it ended.
    async fn write_waiting(&mut self) {
        while let Some(event) = self.events.try_recv() {
            self.write(event).await;
        }
    }

    async fn write(&mut self, event: Event) {
        let Event::Progress(progress) = &event else {
            return;
        };
        let data = response::progress_data(&self.execution_id, progress);
        let recorded = RecordedEvent {
            id: FIRST_PROGRESS_ID + progress.sequence,
            data,
        };
        self.next_id = recorded.id + 1;
        if let Err(error) = self
            .store
            .record_progress(&self.execution_id, recorded)
            .await
        {
            tracing::warn!(%error, "could not record a progress event");
        }
        if let Some(forward) = &self.forward {
            forward.send(event);
        }
    }
}

/// Resolves when someone asks, through the store, for the execution to be cancelled.
async fn cancellation_requested(
    store: Arc<dyn ExecutionStore>,
    caller: Arc<str>,
    execution_id: Arc<str>,
) {
    loop {
        let changed = store.execution_changed(&execution_id);
        if let Ok(Some(record)) = store.execution(&caller, &execution_id).await
            && record.cancel_requested
        {
            return;
        }
        changed.await;
    }
}

/// The pauses between attempts to record an outcome: about 0.7 s in all, inside
/// [`LEASE_MARGIN`].
const RECORD_BACKOFF: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
];

/// Runs `attempt` until it succeeds, [`RECORD_BACKOFF`] is spent, or the next try would start
/// after `until` (a slow store must not hold the answer past the lease); the last error
/// otherwise. The retries, with their timer, are a boxed future of their own: the future of
/// every call that records an outcome stays small for the usual store, which answers at once.
async fn with_backoff<F, Fut, E>(mut attempt: F, until: Instant) -> Result<(), E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    match attempt().await {
        Ok(()) => Ok(()),
        Err(error) => Box::pin(retried(attempt, until, error)).await,
    }
}

/// The retries of [`with_backoff`], after a first attempt that failed with `error`.
async fn retried<F, Fut, E>(mut attempt: F, until: Instant, mut error: E) -> Result<(), E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    for pause in RECORD_BACKOFF {
        if Instant::now() + pause > until {
            break;
        }
        tracing::debug!(error = %error, ?pause, "idempotency store failed; trying again");
        tokio::time::sleep(pause).await;
        match attempt().await {
            Ok(()) => return Ok(()),
            Err(again) => error = again,
        }
    }
    Err(error)
}

/// What the idempotency record keeps of an execution that ran (`protocol.md` §4, the
/// idempotency table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// The answer, replayed to a retry.
    Response,
    /// Nothing: the key is released and a retry runs again.
    Nothing,
    /// That it may or may not have taken effect: a retry gets `EXECUTION_UNCERTAIN`.
    Uncertain,
}

/// The recording decision for a failed, cancelled or timed-out execution: the error was
/// raised before the tool ran (`rejected`) or says the same call may succeed later
/// (`retryable`); `safe_to_rerun`: the tool is idempotent or changes nothing.
fn kept(status: ExecutionStatus, rejected: bool, retryable: bool, safe_to_rerun: bool) -> Kept {
    let interrupted = matches!(
        status,
        ExecutionStatus::Cancelled | ExecutionStatus::TimedOut
    );
    if rejected || retryable {
        Kept::Nothing
    } else if interrupted && !safe_to_rerun {
        Kept::Uncertain
    } else {
        Kept::Response
    }
}

/// `TOOL_NOT_FOUND`, naming (clipped) what was asked for and the nearest tools the caller may
/// see.
fn tool_not_found(catalog: &Catalog, name: &str, trust: TrustLevel) -> ToolError {
    let suggestions = catalog.nearest(name, trust);
    let shown = clip(name);
    let message = match suggestions.as_slice() {
        [] => format!("no tool named `{shown}`"),
        [only] => format!("no tool named `{shown}`; did you mean `{only}`?"),
        several => format!(
            "no tool named `{shown}`; did you mean one of {}?",
            several
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    ToolError::not_found(codes::TOOL_NOT_FOUND, message)
        .details(json!({ "tool": shown, "suggestions": suggestions }))
}

/// A cancelled or timed-out execution: safe to run again only if the tool changes nothing or
/// is idempotent.
fn interrupted(error: ToolError, safe_to_rerun: bool) -> ToolError {
    if safe_to_rerun {
        error.retryable(None)
    } else {
        error
    }
}

/// How a tool's future ended: its result, or the panic it was unwound with.
type ToolResult = std::thread::Result<Result<crate::tool::Output, ToolError>>;

/// How the tool ended, for the answer; a panic is logged here, its message never answered.
fn ran(result: ToolResult) -> Ran {
    match result {
        Ok(Ok(output)) => Ran::Output(output),
        Ok(Err(error)) => Ran::Error(error),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-text panic payload".to_owned());
            tracing::error!(panic = %message, "tool panicked");
            Ran::Panicked
        }
    }
}

/// Polls a tool's call once, outside any timer or cancellation waiter: how it ended, if it
/// did (most tools end without waiting). A call that waits goes on under
/// [`Runtime::interruptible`], whose first poll replaces the no-op waker given here.
fn first_poll(call: &mut CallFuture) -> Option<ToolResult> {
    let polled = panic::catch_unwind(AssertUnwindSafe(|| {
        call.as_mut()
            .poll(&mut std::task::Context::from_waker(Waker::noop()))
    }));
    match polled {
        Ok(Poll::Ready(result)) => Some(Ok(result)),
        Ok(Poll::Pending) => None,
        Err(panic) => Some(Err(panic)),
    }
}

/// The tool's call, after its turn when the tool is not parallel-safe, catching its panics.
async fn serialized(serial: Option<Arc<Mutex<()>>>, call: CallFuture) -> ToolResult {
    let _turn = match &serial {
        Some(lock) => Some(lock.lock().await),
        None => None,
    };
    AssertUnwindSafe(call).catch_unwind().await
}

/// Polls `future` once: its output if it finished, else the future, to go on in a task of its
/// own, whose first poll replaces the no-op waker given here wherever the future waits. An
/// execution that ends without waiting (a quick tool, an in-memory store) costs no task.
pub(crate) fn poll_once<F: Future>(future: F) -> Result<F::Output, Pin<Box<F>>> {
    let mut future = Box::pin(future);
    match future
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(output) => Ok(output),
        std::task::Poll::Pending => Err(future),
    }
}

/// A new execution id, `exec_` and a UUID v7 (time-ordered), written in one allocation.
fn new_execution_id() -> Arc<str> {
    const PREFIX: &str = "exec_";
    let mut text = [0u8; PREFIX.len() + uuid::fmt::Hyphenated::LENGTH];
    text[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
    let id = uuid::Uuid::now_v7();
    id.hyphenated().encode_lower(&mut text[PREFIX.len()..]);
    Arc::from(std::str::from_utf8(&text).expect("a prefix and a UUID are ASCII"))
}

fn answer_error(
    execution_id: &Arc<str>,
    status: ExecutionStatus,
    error: &ToolError,
    next_actions: &[NextAction<'_>],
) -> Outcome {
    Outcome {
        response: StoredResponse {
            execution_id: execution_id.clone(),
            status,
            category: Some(error.category()),
            code: Some(Arc::from(error.code())),
            body: response::failed(execution_id, status, error, next_actions),
        },
        replayed: false,
        retry_after: error.retry_after(),
    }
}

fn emit_started(events: Option<&EventSender>, execution_id: &Arc<str>, tool: &str) {
    if let Some(events) = events {
        events.send(Event::Started {
            execution_id: execution_id.clone(),
            tool: tool.to_owned(),
        });
    }
}

/// An execution that took this long is logged at INFO even when it completed.
const SLOW: Duration = Duration::from_secs(1);

/// Counts an answered call for `/metrics`, when they are on.
fn count_answer(
    metrics: Option<&Metrics>,
    tool: Option<&'static str>,
    outcome: &Outcome,
    elapsed: Duration,
) {
    if let Some(metrics) = metrics {
        let status = outcome.response.status;
        metrics.execution_answered(tool, status, outcome.replayed, elapsed);
    }
}

/// Records the outcome on the execution's span, and logs it: a call that completed quickly at
/// DEBUG (the usual case costs nothing at the default INFO), any other at INFO with its
/// fields on the line, since the span itself is at DEBUG.
fn record_span(span: &tracing::Span, outcome: &Outcome, elapsed: Duration) {
    let status = outcome.response.status.as_str();
    let duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    let code = outcome.response.code.as_deref();
    span.record("status", status);
    span.record("duration_ms", duration_ms);
    if let Some(code) = code {
        span.record("error_code", code);
    }
    let _entered = span.enter();
    if outcome.response.status == ExecutionStatus::Completed && elapsed < SLOW {
        tracing::debug!(replayed = outcome.replayed, "execution finished");
    } else {
        tracing::info!(
            execution_id = &*outcome.response.execution_id,
            status,
            error_code = code,
            duration_ms,
            replayed = outcome.replayed,
            "execution finished"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{ExecutionStatus, Kept, RECORD_BACKOFF, kept, with_backoff};

    /// `protocol.md` §4, the idempotency table, row by row.
    #[test]
    fn recording_follows_the_idempotency_table() {
        use ExecutionStatus::{Cancelled, Completed, Failed, TimedOut};
        // (status, rejected before running, retryable, safe to rerun) → kept
        let table = [
            ((Completed, false, false, false), Kept::Response),
            ((Completed, false, false, true), Kept::Response),
            ((Failed, false, false, false), Kept::Response),
            ((Failed, false, false, true), Kept::Response),
            ((Failed, true, false, false), Kept::Nothing),
            ((Failed, false, true, false), Kept::Nothing),
            ((Failed, false, true, true), Kept::Nothing),
            ((Cancelled, false, false, false), Kept::Uncertain),
            ((TimedOut, false, false, false), Kept::Uncertain),
            ((Cancelled, false, true, true), Kept::Nothing),
            ((TimedOut, false, true, true), Kept::Nothing),
            ((TimedOut, false, false, true), Kept::Response),
            ((Cancelled, true, false, false), Kept::Nothing),
        ];
        for ((status, rejected, retryable, safe), expected) in table {
            assert_eq!(
                kept(status, rejected, retryable, safe),
                expected,
                "{status:?} rejected={rejected} retryable={retryable} safe={safe}"
            );
        }
    }

    /// A store that fails every time, answered with its last error after each attempt
    /// `with_backoff` may make; the first answer that succeeds ends the attempts.
    async fn attempts_until(until: Instant, failures: usize) -> (usize, Result<(), String>) {
        let made = Cell::new(0);
        let attempt = || {
            made.set(made.get() + 1);
            let n = made.get();
            std::future::ready(if n > failures {
                Ok(())
            } else {
                Err(format!("failure {n}"))
            })
        };
        let result = with_backoff(attempt, until).await;
        (made.get(), result)
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_store_is_tried_once_per_pause_then_the_last_error_is_returned() {
        let all_pauses: Duration = RECORD_BACKOFF.iter().sum();
        let until = Instant::now() + all_pauses + Duration::from_secs(1);
        let (made, result) = attempts_until(until, usize::MAX).await;
        assert_eq!(made, RECORD_BACKOFF.len() + 1);
        assert_eq!(result, Err(format!("failure {made}")));

        let (made, result) = attempts_until(until, 2).await;
        assert_eq!((made, result), (3, Ok(())));

        let (made, result) = attempts_until(until, 0).await;
        assert_eq!((made, result), (1, Ok(())));
    }

    #[tokio::test(start_paused = true)]
    async fn no_attempt_starts_after_the_lease() {
        // Room for the first pause only: two attempts, the second's error returned.
        let until = Instant::now() + RECORD_BACKOFF[0] + Duration::from_millis(1);
        let (made, result) = attempts_until(until, usize::MAX).await;
        assert_eq!((made, result), (2, Err("failure 2".to_owned())));

        let (made, result) = attempts_until(Instant::now(), usize::MAX).await;
        assert_eq!((made, result), (1, Err("failure 1".to_owned())));
    }
}
