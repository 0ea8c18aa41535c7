//! A record as the persistent stores write and read it: plain strings and bytes, one meaning
//! for every backend.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::{Fingerprint, Finish, Reservation, StoreError, StoredResponse};
use crate::status::ExecutionStatus;
use crate::tool_error::Category;

pub(crate) const RUNNING: &str = "running";
pub(crate) const FINISHED: &str = "finished";
pub(crate) const UNCERTAIN: &str = "uncertain";

/// The poll interval of a duplicate waiting on a record held by another replica: short at
/// first (most executions are quick), growing with the time the record has been running.
fn poll_interval(running_for: Duration) -> Duration {
    (running_for / 8).clamp(Duration::from_millis(25), Duration::from_millis(250))
}

/// What a store found under a key it could not claim.
#[derive(Debug)]
pub(crate) struct Found {
    pub(crate) tool: String,
    pub(crate) digest: Vec<u8>,
    pub(crate) execution_id: String,
    /// [`RUNNING`], [`FINISHED`] or [`UNCERTAIN`] (a running record whose lease has passed is
    /// reported, and stored, as uncertain).
    pub(crate) state: String,
    /// How long ago the key was reserved (sets a waiting duplicate's poll interval).
    pub(crate) running_for: Duration,
    pub(crate) response: Option<Stored>,
}

/// The columns of a finished record's response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) status: String,
    pub(crate) category: Option<String>,
    pub(crate) code: Option<String>,
    pub(crate) body: Vec<u8>,
}

impl Found {
    /// What the runtime is told about this record when it asks for `fingerprint`.
    pub(crate) fn reservation(self, fingerprint: &Fingerprint) -> Result<Reservation, StoreError> {
        if self.tool != *fingerprint.tool || self.digest != fingerprint.digest {
            return Ok(Reservation::Conflict {
                tool: Arc::from(self.tool),
            });
        }
        match (self.state.as_str(), self.response) {
            (RUNNING, _) => Ok(Reservation::Running {
                execution_id: Arc::from(self.execution_id),
                changed: Box::pin(tokio::time::sleep(poll_interval(self.running_for))),
            }),
            (UNCERTAIN, _) => Ok(Reservation::Uncertain {
                execution_id: Arc::from(self.execution_id),
            }),
            (FINISHED, Some(stored)) => {
                Ok(Reservation::Finished(stored.response(&self.execution_id)?))
            }
            (state, _) => Err(StoreError::message(format!(
                "unreadable idempotency record: state `{state}`"
            ))),
        }
    }
}

impl Stored {
    /// The record's state and response columns for `finish`.
    pub(crate) fn of(finish: Finish<'_>) -> (&'static str, Option<Stored>) {
        match finish {
            Finish::Response(response) => (
                FINISHED,
                Some(Stored {
                    status: response.status.as_str().to_owned(),
                    category: response
                        .category
                        .map(|category| category.as_str().to_owned()),
                    code: response.code.as_deref().map(str::to_owned),
                    body: response.body.to_vec(),
                }),
            ),
            Finish::Uncertain { .. } => (UNCERTAIN, None),
        }
    }

    pub(crate) fn response(self, execution_id: &str) -> Result<StoredResponse, StoreError> {
        let unreadable = |what: &str, value: &str| {
            StoreError::message(format!("unreadable idempotency record: {what} `{value}`"))
        };
        let status = ExecutionStatus::from_wire(&self.status)
            .ok_or_else(|| unreadable("status", &self.status))?;
        let category = match self.category.as_deref() {
            Some(name) => {
                Some(Category::from_wire(name).ok_or_else(|| unreadable("category", name))?)
            }
            None => None,
        };
        Ok(StoredResponse {
            execution_id: Arc::from(execution_id),
            status,
            category,
            code: self.code.map(Arc::from),
            body: Bytes::from(self.body),
        })
    }
}

/// A store's periodic deletion of expired records; it stops when the store is dropped.
#[cfg(any(feature = "postgres", feature = "file"))]
pub(crate) struct Cleanup(tokio::task::JoinHandle<()>);

#[cfg(any(feature = "postgres", feature = "file"))]
impl Cleanup {
    /// Runs `purge` every `interval`, the first time one interval from now.
    pub(crate) fn every<F>(interval: Duration, purge: impl Fn() -> F + Send + 'static) -> Self
    where
        F: std::future::Future<Output = Result<usize, StoreError>> + Send,
    {
        Cleanup(tokio::spawn(async move {
            let start = tokio::time::Instant::now() + interval;
            let mut ticks = tokio::time::interval_at(start, interval);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match purge().await {
                    Ok(purged) => tracing::debug!(purged, "purged expired idempotency records"),
                    Err(error) => {
                        tracing::warn!(%error, "could not purge expired idempotency records");
                    }
                }
            }
        }))
    }
}

#[cfg(any(feature = "postgres", feature = "file"))]
impl Drop for Cleanup {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `call`, or an unavailable store once `timeout` has passed.
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) async fn within<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|_| Err(timed_out(timeout)))
}

#[cfg(any(feature = "postgres", feature = "redis"))]
fn timed_out(timeout: Duration) -> StoreError {
    StoreError::message(format!(
        "the store did not answer within {} ms",
        timeout.as_millis()
    ))
}

/// Runs a shared store's reservation in its own task and waits for it at most `timeout`.
///
/// A stalled store still holds the claim it was sent and may apply it once it resumes; by then
/// the caller has been told the store is unavailable and the tool has not run. So when the
/// caller has given up, the task waits for the claim's fate (at most `give_up_after`) and
/// releases it with `undo`, fenced by the execution id: the record of an execution that never
/// ran is not left behind to block retries.
#[cfg(any(feature = "postgres", feature = "redis"))]
pub(crate) async fn reserve_within<U>(
    timeout: Duration,
    give_up_after: Duration,
    reserve: impl std::future::Future<Output = Result<Reservation, StoreError>> + Send + 'static,
    undo: impl Fn() -> U + Send + Sync + 'static,
) -> Result<Reservation, StoreError>
where
    U: std::future::Future<Output = Result<(), StoreError>> + Send + 'static,
{
    let undo = Arc::new(undo);
    let (sender, mut receiver) = tokio::sync::oneshot::channel();
    let late_undo = Arc::clone(&undo);
    tokio::spawn(async move {
        let reservation = tokio::time::timeout(give_up_after, reserve)
            .await
            .unwrap_or_else(|_| Err(timed_out(give_up_after)));
        if let Err(unanswered) = sender.send(reservation) {
            undo_claim(unanswered, &*late_undo).await;
        }
    });
    match tokio::time::timeout(timeout, &mut receiver).await {
        Ok(Ok(reservation)) => reservation,
        Ok(Err(_)) => Err(StoreError::message("the reservation task failed")),
        Err(_) => {
            // The answer may have come in just now: then it is this side's to undo.
            receiver.close();
            if let Ok(answered) = receiver.try_recv() {
                tokio::spawn(async move { undo_claim(answered, &*undo).await });
            }
            Err(timed_out(timeout))
        }
    }
}

/// Releases a claim nobody will use: one that was made, or that failed and may yet land.
#[cfg(any(feature = "postgres", feature = "redis"))]
async fn undo_claim<U>(reservation: Result<Reservation, StoreError>, undo: &impl Fn() -> U)
where
    U: std::future::Future<Output = Result<(), StoreError>>,
{
    if matches!(reservation, Ok(Reservation::Reserved) | Err(_))
        && let Err(error) = undo().await
    {
        tracing::warn!(%error, "could not release a reservation made after its call gave up");
    }
}
