//! The idempotency key (`protocol.md` §4): reserved before the tool runs, finished or released
//! after, retried with backoff while the store fails within the lease.

use super::*;

impl Runtime {
    /// Claims the idempotency key. A duplicate of a running call waits for it when `wait`,
    /// and is told which execution runs it otherwise.
    pub(super) async fn reserve(
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
    pub(super) fn store_failed(
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

    /// Records how the execution that reserved `key` ended. A store that fails is tried again
    /// with backoff before the call answers, until `lease_end` (while the record is still this
    /// execution's); the failure is logged once per call, and rate-limited across calls.
    pub(super) async fn keep(&self, key: &IdempotencyKey, finish: Finish<'_>, lease_end: Instant) {
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
    pub(super) async fn release(&self, prepared: &Prepared, key: &IdempotencyKey) {
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

/// The pauses between attempts to record an outcome: about 0.7 s in all, inside
/// [`LEASE_MARGIN`].
pub(super) const RECORD_BACKOFF: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
];

/// Runs `attempt` until it succeeds, [`RECORD_BACKOFF`] is spent, or the next try would start
/// after `until` (a slow store must not hold the answer past the lease); the last error
/// otherwise. The retries, with their timer, are a boxed future of their own: the future of
/// every call that records an outcome stays small for the usual store, which answers at once.
pub(super) async fn with_backoff<F, Fut, E>(mut attempt: F, until: Instant) -> Result<(), E>
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
pub(super) async fn retried<F, Fut, E>(
    mut attempt: F,
    until: Instant,
    mut error: E,
) -> Result<(), E>
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{RECORD_BACKOFF, with_backoff};

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
