//! How an execution ended, as the answer the caller gets and what the idempotency table keeps
//! of it; its span and metrics.

use super::*;

impl Runtime {
    /// Turns how the tool ended into the answer, and records it as the idempotency table says.
    pub(super) async fn conclude(
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
    pub(super) fn outcome_of(
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
    pub(super) fn answer_rejection(
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
    pub(super) fn answer_failure(
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
}

/// What the idempotency record keeps of an execution that ran (`protocol.md` §4, the
/// idempotency table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kept {
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
pub(super) fn kept(
    status: ExecutionStatus,
    rejected: bool,
    retryable: bool,
    safe_to_rerun: bool,
) -> Kept {
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

/// A cancelled or timed-out execution: safe to run again only if the tool changes nothing or
/// is idempotent.
pub(super) fn interrupted(error: ToolError, safe_to_rerun: bool) -> ToolError {
    if safe_to_rerun {
        error.retryable(None)
    } else {
        error
    }
}

/// A new execution id, `exec_` and a UUID v7 (time-ordered), written in one allocation.
pub(super) fn new_execution_id() -> Arc<str> {
    const PREFIX: &str = "exec_";
    let mut text = [0u8; PREFIX.len() + uuid::fmt::Hyphenated::LENGTH];
    text[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
    let id = uuid::Uuid::now_v7();
    id.hyphenated().encode_lower(&mut text[PREFIX.len()..]);
    Arc::from(std::str::from_utf8(&text).expect("a prefix and a UUID are ASCII"))
}

pub(super) fn answer_error(
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

pub(super) fn emit_started(events: Option<&EventSender>, execution_id: &Arc<str>, tool: &str) {
    if let Some(events) = events {
        events.send(Event::Started {
            execution_id: execution_id.clone(),
            tool: tool.to_owned(),
        });
    }
}

/// An execution that took this long is logged at INFO even when it completed.
pub(super) const SLOW: Duration = Duration::from_secs(1);

/// Counts an answered call for `/metrics`, when they are on.
pub(super) fn count_answer(
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
pub(super) fn record_span(span: &tracing::Span, outcome: &Outcome, elapsed: Duration) {
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
    use super::{ExecutionStatus, Kept, kept};

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
}
