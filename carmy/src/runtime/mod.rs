//! The execution pipeline, shared by every transport; it knows nothing of HTTP.
//!
//! resolve the tool → gate (confirmation) → validate the arguments → reserve the idempotency
//! key → take an in-flight slot → run under the deadline and the cancellation token, catching
//! panics → serialize → record → answer.

mod fingerprint;
pub(crate) mod response;

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::{Value, json};
use tokio::sync::{Mutex, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::catalog::Catalog;
use crate::context::{Context, Principal, Progress};
use crate::health::Health;
use crate::idempotency::{
    ExecutionStatus, Fingerprint, Finish, IdempotencyKey, IdempotencyStore, Reservation,
    StoredResponse,
};
use crate::state::StateMap;
use crate::tool::{Confirmation, Invocation, ToolDescriptor};
use crate::tool_error::{Category, ToolError, Violation, codes};
use response::NextAction;

/// How the runtime is tuned; set through the [`App`](crate::App) builder.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) default_timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) record_ttl: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_timeout: Duration::from_secs(30),
            max_in_flight: 1_024,
            record_ttl: Duration::from_secs(24 * 60 * 60),
        }
    }
}

/// How long a reservation outlives the execution's deadline: time to record the outcome.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// What a transport asks the runtime to run.
#[derive(Debug)]
pub(crate) struct Call {
    pub(crate) tool: String,
    pub(crate) arguments: Value,
    /// Already checked with [`check_request_id`].
    pub(crate) request_id: Option<String>,
    pub(crate) principal: Principal,
}

/// What an execution tells a transport that streams.
#[derive(Debug)]
pub(crate) enum Event {
    /// The answer will carry this execution id.
    Started {
        execution_id: Arc<str>,
        tool: String,
    },
    /// The tool reported progress.
    Progress(Progress),
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
    catalog: Arc<Catalog>,
    states: Arc<StateMap>,
    store: Arc<dyn IdempotencyStore>,
    settings: Settings,
    in_flight: Arc<Semaphore>,
    /// One lock per tool declared `parallel_safe = false`.
    serial: HashMap<&'static str, Arc<Mutex<()>>>,
    /// Fired to cancel every execution (the end of a graceful shutdown).
    shutdown: CancellationToken,
    tasks: TaskTracker,
    health: Health,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("catalog", &self.catalog)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// A call that passed the checks that need no record: ready to reserve and run.
struct Prepared {
    execution_id: Arc<str>,
    tool: &'static ToolDescriptor,
    arguments: Arc<Value>,
    request_id: Option<String>,
    principal: Principal,
    idempotency: Option<(IdempotencyKey, Fingerprint)>,
    deadline: Instant,
}

/// A call refused before it could run, with what the suggestions need.
struct Rejected {
    error: ToolError,
    tool: String,
    arguments: Value,
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
    pub(crate) fn new(
        catalog: Arc<Catalog>,
        states: StateMap,
        store: Arc<dyn IdempotencyStore>,
        settings: Settings,
        health: Health,
    ) -> Self {
        let serial = catalog
            .tools()
            .iter()
            .filter(|tool| !tool.descriptor.parallel_safe)
            .map(|tool| (tool.descriptor.name, Arc::new(Mutex::new(()))))
            .collect();
        Runtime {
            catalog,
            states: Arc::new(states),
            store,
            in_flight: Arc::new(Semaphore::new(settings.max_in_flight)),
            settings,
            serial,
            shutdown: CancellationToken::new(),
            tasks: TaskTracker::new(),
            health,
        }
    }

    pub(crate) fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    pub(crate) fn health(&self) -> &Health {
        &self.health
    }

    /// Cancels every execution still running.
    pub(crate) fn cancel_all(&self) {
        self.shutdown.cancel();
    }

    /// Fires with [`Runtime::cancel_all`]: transports end their long-lived streams then.
    #[cfg(feature = "mcp")]
    pub(crate) fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.child_token()
    }

    /// Waits until every execution has finished and recorded its outcome.
    pub(crate) async fn wait_idle(&self) {
        self.tasks.close();
        self.tasks.wait().await;
        self.tasks.reopen();
    }

    /// Runs `call`. Firing `cancel` (the client went away) cancels the execution; the outcome
    /// is still recorded, because the execution runs in its own task.
    pub(crate) async fn execute(
        self: &Arc<Self>,
        call: Call,
        cancel: CancellationToken,
        events: Option<mpsc::UnboundedSender<Event>>,
    ) -> Outcome {
        let execution_id: Arc<str> = format!("exec_{}", uuid::Uuid::now_v7()).into();
        let span = tracing::info_span!(
            "carmy.execution",
            execution_id = &*execution_id,
            request_id = call.request_id.as_deref(),
            tool = call.tool.as_str(),
            effect = tracing::field::Empty,
            status = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
            error_code = tracing::field::Empty,
        );
        let started = Instant::now();
        let outcome = match self.prepare(call, execution_id.clone()) {
            Err(rejected) => {
                let _entered = span.enter();
                self.answer_rejection(&execution_id, &rejected, events.as_ref())
            }
            // Without a request_id nothing is recorded, so the execution can run in this
            // future: if the client goes away, dropping it cancels the tool.
            Ok(prepared) if prepared.idempotency.is_none() => {
                span.record("effect", prepared.tool.effect.as_str());
                Arc::clone(self)
                    .run(prepared, cancel, events)
                    .instrument(span.clone())
                    .await
            }
            // With one, the execution runs in its own task so its outcome is recorded even if
            // the client goes away.
            Ok(prepared) => {
                span.record("effect", prepared.tool.effect.as_str());
                let runtime = Arc::clone(self);
                let task = self.tasks.spawn(
                    runtime
                        .run(prepared, cancel, events)
                        .instrument(span.clone()),
                );
                match task.await {
                    Ok(outcome) => outcome,
                    Err(join_error) => {
                        tracing::error!(parent: &span, error = %join_error, "execution task failed");
                        let error = ToolError::internal(codes::INTERNAL, "internal error");
                        answer_error(&execution_id, ExecutionStatus::Failed, &error, &[])
                    }
                }
            }
        };
        record_span(&span, &outcome, started);
        outcome
    }

    /// The checks that need no record: resolve, gate, validate. On failure, returns the error
    /// and the arguments (for the suggestions).
    fn prepare(&self, call: Call, execution_id: Arc<str>) -> Result<Prepared, Rejected> {
        let Call {
            tool,
            arguments,
            request_id,
            principal,
        } = call;
        let Some(entry) = self.catalog.get_visible(&tool, principal.trust()) else {
            let error =
                ToolError::not_found(codes::TOOL_NOT_FOUND, format!("no tool named `{tool}`"))
                    .details(json!({ "tool": tool }));
            return Err(Rejected {
                error,
                tool,
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
                arguments,
            });
        }
        // The fast check first; the detailed walk only for arguments that fail it.
        if !entry.validator.is_valid(&arguments) {
            let violations: Vec<Violation> = entry
                .validator
                .iter_errors(&arguments)
                .map(|violation| Violation {
                    path: violation.instance_path().to_string(),
                    keyword: violation.kind().keyword().to_owned(),
                    message: violation.to_string(),
                })
                .collect();
            let error = ToolError::validation(
                codes::INVALID_ARGUMENTS,
                "arguments do not match the input schema",
            )
            .details(json!({ "errors": violations }));
            return Err(Rejected {
                error,
                tool,
                arguments,
            });
        }
        let idempotency = request_id.as_ref().map(|request_id| {
            (
                IdempotencyKey::new(principal.shared_id(), request_id.as_str()),
                fingerprint::fingerprint(descriptor.name, &arguments),
            )
        });
        let timeout = descriptor.timeout.unwrap_or(self.settings.default_timeout);
        Ok(Prepared {
            execution_id,
            tool: descriptor,
            arguments: Arc::new(arguments),
            request_id,
            principal,
            idempotency,
            deadline: Instant::now() + timeout,
        })
    }

    /// Reserve → run → record. Runs in its own task so the record is written even when the
    /// client is gone.
    async fn run(
        self: Arc<Self>,
        prepared: Prepared,
        cancel: CancellationToken,
        events: Option<mpsc::UnboundedSender<Event>>,
    ) -> Outcome {
        if let Some((key, fingerprint)) = &prepared.idempotency
            && let Some(outcome) = self
                .reserve(&prepared, key, fingerprint, &cancel, events.as_ref())
                .await
        {
            return outcome;
        }
        let Ok(_permit) = Arc::clone(&self.in_flight).try_acquire_owned() else {
            self.release(&prepared).await;
            let error = ToolError::capacity(codes::OVERLOADED, "too many executions in flight")
                .retryable(Duration::from_secs(1));
            return self.answer_failure(
                &prepared,
                ExecutionStatus::Failed,
                &error,
                events.as_ref(),
            );
        };
        emit_started(events.as_ref(), &prepared.execution_id, prepared.tool.name);
        let ran = self.invoke(&prepared, &cancel, events.as_ref()).await;
        self.conclude(&prepared, ran, events.as_ref()).await
    }

    /// Claims the idempotency key. `None`: reserved, go on and run. `Some`: the answer (a
    /// replay, a conflict, or a wait that ended without one).
    async fn reserve(
        &self,
        prepared: &Prepared,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        cancel: &CancellationToken,
        events: Option<&mpsc::UnboundedSender<Event>>,
    ) -> Option<Outcome> {
        loop {
            // The claim outlives the deadline by a margin, so that only an execution that
            // will never record its outcome (its process died) lets the lease pass.
            let lease = prepared.deadline.saturating_duration_since(Instant::now()) + LEASE_MARGIN;
            let reservation = self
                .store
                .reserve(
                    key,
                    fingerprint,
                    &prepared.execution_id,
                    lease,
                    self.settings.record_ttl,
                )
                .await;
            let error = match reservation {
                Ok(Reservation::Reserved) => return None,
                Ok(Reservation::Finished(response)) => {
                    emit_started(events, &response.execution_id, prepared.tool.name);
                    return Some(Outcome {
                        response,
                        replayed: true,
                        retry_after: None,
                    });
                }
                Ok(Reservation::Running { changed }) => {
                    tokio::select! {
                        () = changed => continue,
                        () = cancel.cancelled() => {
                            let error = ToolError::cancelled(codes::CANCELLED, "the call was cancelled while waiting for the same request")
                                .retryable(None);
                            return Some(self.answer_failure(prepared, ExecutionStatus::Cancelled, &error, events));
                        }
                        () = tokio::time::sleep_until(prepared.deadline) => {
                            let error = ToolError::timeout(codes::TIMEOUT, "the first call with this request_id is still running")
                                .retryable(Duration::from_secs(1));
                            return Some(self.answer_failure(prepared, ExecutionStatus::TimedOut, &error, events));
                        }
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
                    tracing::error!(error = %store_error, "idempotency store failed");
                    ToolError::capacity(
                        codes::IDEMPOTENCY_UNAVAILABLE,
                        "the idempotency store is unavailable",
                    )
                    .retryable(Duration::from_secs(1))
                }
            };
            return Some(self.answer_failure(prepared, ExecutionStatus::Failed, &error, events));
        }
    }

    /// Runs the tool under its deadline and the cancellation tokens, catching panics.
    async fn invoke(
        &self,
        prepared: &Prepared,
        cancel: &CancellationToken,
        events: Option<&mpsc::UnboundedSender<Event>>,
    ) -> Ran {
        let token = self.shutdown.child_token();
        // However this future ends (finished, or dropped with its client), whatever the tool
        // handed to other tasks sees the cancellation.
        let _cancel_on_exit = token.clone().drop_guard();
        let context = Context::new(
            prepared.execution_id.clone(),
            prepared.request_id.clone(),
            prepared.principal.clone(),
            token.clone(),
            events.cloned(),
            self.health.clone(),
        );
        let invocation = Invocation {
            arguments: Arc::clone(&prepared.arguments),
            context,
            states: Arc::clone(&self.states),
        };
        let serial = self.serial.get(prepared.tool.name).cloned();
        let call = prepared.tool.call;
        let work = async move {
            let _turn = match &serial {
                Some(lock) => Some(lock.lock().await),
                None => None,
            };
            AssertUnwindSafe(call(invocation)).catch_unwind().await
        };
        // The tool's branch first: a tool that finishes on its first poll never registers the
        // deadline's timer or the cancellation waiters, the common fast path.
        let ran = tokio::select! {
            biased;
            result = work => match result {
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
            },
            () = cancel.cancelled() => Ran::Cancelled,
            () = token.cancelled() => Ran::Cancelled,
            () = tokio::time::sleep_until(prepared.deadline) => Ran::TimedOut,
        };
        ran
    }

    /// Turns how the tool ended into the answer, and records it as the idempotency table says.
    async fn conclude(
        &self,
        prepared: &Prepared,
        ran: Ran,
        events: Option<&mpsc::UnboundedSender<Event>>,
    ) -> Outcome {
        let tool = prepared.tool;
        let safe_to_rerun = tool.idempotent || tool.effect.is_read_only();
        let (status, error) = match ran {
            Ran::Output(output) => {
                let cacheable = tool.idempotent && tool.effect.is_read_only();
                let body = response::completed(&prepared.execution_id, &output.0, cacheable);
                let response = StoredResponse {
                    execution_id: prepared.execution_id.clone(),
                    status: ExecutionStatus::Completed,
                    category: None,
                    code: None,
                    body,
                };
                self.keep(prepared, Finish::Response(response.clone()))
                    .await;
                return Outcome {
                    response,
                    replayed: false,
                    retry_after: None,
                };
            }
            Ran::Error(error) => {
                if error.category() == Category::Internal {
                    tracing::error!(code = error.code(), source = ?error.source(), "tool failed");
                }
                (ExecutionStatus::Failed, error)
            }
            Ran::Panicked => (
                ExecutionStatus::Failed,
                ToolError::internal(codes::TOOL_PANIC, "the tool panicked"),
            ),
            Ran::Cancelled => {
                let error = ToolError::cancelled(codes::CANCELLED, "the execution was cancelled");
                (
                    ExecutionStatus::Cancelled,
                    interrupted(error, safe_to_rerun),
                )
            }
            Ran::TimedOut => {
                let error =
                    ToolError::timeout(codes::TIMEOUT, "the execution ran past its deadline")
                        .details(json!({
                            "timeout_ms": tool
                                .timeout
                                .unwrap_or(self.settings.default_timeout)
                                .as_millis()
                        }));
                (ExecutionStatus::TimedOut, interrupted(error, safe_to_rerun))
            }
        };
        let outcome = self.answer_failure(prepared, status, &error, events);
        let interrupted = matches!(
            status,
            ExecutionStatus::Cancelled | ExecutionStatus::TimedOut
        );
        if error.is_rejected_before_running() || error.is_retryable() {
            self.release(prepared).await;
        } else if interrupted && !safe_to_rerun {
            let finish = Finish::Uncertain {
                execution_id: prepared.execution_id.clone(),
            };
            self.keep(prepared, finish).await;
        } else if prepared.idempotency.is_some() {
            self.keep(prepared, Finish::Response(outcome.response.clone()))
                .await;
        }
        outcome
    }

    /// The answer for a call refused before it could run.
    fn answer_rejection(
        &self,
        execution_id: &Arc<str>,
        rejected: &Rejected,
        events: Option<&mpsc::UnboundedSender<Event>>,
    ) -> Outcome {
        let Rejected {
            error,
            tool,
            arguments,
        } = rejected;
        emit_started(events, execution_id, tool);
        let next_actions = match error.code() {
            codes::CONFIRMATION_REQUIRED => vec![NextAction {
                tool,
                arguments: Some(arguments),
                reason: format!(
                    "needs the user's confirmation: ask the user, and call again once the host \
                     has granted `confirm:{tool}`"
                ),
                after_ms: None,
            }],
            _ => Vec::new(),
        };
        answer_error(execution_id, ExecutionStatus::Failed, error, &next_actions)
    }

    /// The answer for a failure of `prepared`, with its suggestions.
    fn answer_failure(
        &self,
        prepared: &Prepared,
        status: ExecutionStatus,
        error: &ToolError,
        events: Option<&mpsc::UnboundedSender<Event>>,
    ) -> Outcome {
        emit_started(events, &prepared.execution_id, prepared.tool.name);
        let mut next_actions = Vec::new();
        if error.is_retryable() {
            next_actions.push(NextAction {
                tool: prepared.tool.name,
                arguments: Some(&prepared.arguments),
                reason: if prepared.request_id.is_some() {
                    "the same call may succeed later: retry it with the same request_id".to_owned()
                } else {
                    "the same call may succeed later: retry it".to_owned()
                },
                after_ms: error
                    .retry_after()
                    .map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX)),
            });
        }
        if let Some(suggested) = error.suggested_action() {
            next_actions.push(NextAction {
                tool: suggested,
                arguments: None,
                reason: format!("suggested after `{}`: {}", error.code(), error.message()),
                after_ms: None,
            });
        }
        answer_error(&prepared.execution_id, status, error, &next_actions)
    }

    async fn keep(&self, prepared: &Prepared, finish: Finish) {
        let Some((key, _)) = &prepared.idempotency else {
            return;
        };
        if let Err(error) = self
            .store
            .finish(key, finish, self.settings.record_ttl)
            .await
        {
            tracing::error!(error = %error, "could not record the outcome");
        }
    }

    async fn release(&self, prepared: &Prepared) {
        let Some((key, _)) = &prepared.idempotency else {
            return;
        };
        if let Err(error) = self.store.release(key).await {
            tracing::error!(error = %error, "could not release the request_id");
        }
    }
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

fn emit_started(
    events: Option<&mpsc::UnboundedSender<Event>>,
    execution_id: &Arc<str>,
    tool: &str,
) {
    if let Some(events) = events {
        let _ = events.send(Event::Started {
            execution_id: execution_id.clone(),
            tool: tool.to_owned(),
        });
    }
}

fn record_span(span: &tracing::Span, outcome: &Outcome, started: Instant) {
    span.record("status", outcome.response.status.as_str());
    span.record(
        "duration_ms",
        u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    );
    if let Some(code) = &outcome.response.code {
        span.record("error_code", &**code);
    }
    let _entered = span.enter();
    tracing::info!(replayed = outcome.replayed, "execution finished");
}
