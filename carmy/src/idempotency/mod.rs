//! Idempotency records: how a retried call with the same `request_id` gets the first call's
//! answer instead of running twice (`protocol.md` §4, the idempotency table).
//!
//! The runtime drives an [`IdempotencyStore`]; it is designed for shared engines: every
//! transition is one atomic operation on one key, and a duplicate that finds the key running
//! either waits on a notification (in-process stores) or polls.
//!
//! Stores: [`MemoryStore`] (the default), and behind cargo features `PostgresStore`
//! (`postgres`), `RedisStore` (`redis`) and `FileStore` (`file`). [`connect`] picks one by URL.

#[cfg(any(feature = "postgres", feature = "redis"))]
mod announcements;
mod connect;
mod executions;
#[cfg(feature = "file")]
mod file;
mod memory;
mod options;
mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(any(feature = "postgres", feature = "redis", feature = "file"))]
pub(crate) mod record;
#[cfg(feature = "redis")]
pub(crate) mod redis;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

pub use connect::{IDEMPOTENCY_URL_VAR, connect, connect_from_env, connect_with};
pub(crate) use executions::ProcessExecutions;
pub use executions::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionState, ExecutionSummary, KEPT_PROGRESS,
    RecordedEvent, RecordedOutcome,
};
#[cfg(feature = "file")]
pub use file::FileStore;
pub use memory::MemoryStore;
pub use options::StoreOptions;
pub use outbox::{
    AfterAttempt, ClaimedDelivery, DeliveryAttempt, KEPT_ATTEMPTS, OutboxEvent, StoredSubscription,
};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;

use crate::status::ExecutionStatus;
use crate::tool_error::Category;

/// Who asked and with which `request_id`: records are kept per caller.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    caller: Arc<str>,
    request_id: Arc<str>,
}

impl IdempotencyKey {
    /// The key of `request_id` sent by the caller `caller` (a principal id).
    pub fn new(caller: impl Into<Arc<str>>, request_id: impl Into<Arc<str>>) -> Self {
        IdempotencyKey {
            caller: caller.into(),
            request_id: request_id.into(),
        }
    }

    /// The caller's principal id.
    pub fn caller(&self) -> &str {
        &self.caller
    }

    /// The client's `request_id`.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.caller, self.request_id)
    }
}

/// What a call was: the tool and a digest of its canonical arguments. A retry with the same
/// key must have the same fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint {
    /// The tool's name (reported when a key is reused for another call).
    pub tool: Arc<str>,
    /// SHA-256 of the tool name and the canonical arguments.
    pub digest: [u8; 32],
}

/// A finished execution's answer, kept so a retry gets it byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// The execution's id (also inside `body`).
    pub execution_id: Arc<str>,
    /// How it ended.
    pub status: ExecutionStatus,
    /// The error's category when it failed (decides the HTTP status).
    pub category: Option<Category>,
    /// The error's code when it failed.
    pub code: Option<Arc<str>>,
    /// The complete response body.
    pub body: Bytes,
}

/// What [`IdempotencyStore::reserve`] found.
pub enum Reservation {
    /// The key was free and is now held by this execution: run the tool, then
    /// [`IdempotencyStore::finish`] or [`IdempotencyStore::release`].
    Reserved,
    /// The same call already finished: answer with its response.
    Finished(StoredResponse),
    /// The same call is running elsewhere: wait on `changed`, then reserve again.
    Running {
        /// The execution holding the key (an async duplicate is answered with it).
        execution_id: Arc<str>,
        /// Resolves when the record may have changed (a notification or a poll interval).
        changed: BoxFuture<'static, ()>,
    },
    /// The key was used for a different call.
    Conflict {
        /// The tool of the recorded call.
        tool: Arc<str>,
    },
    /// An earlier execution with this key may or may not have taken effect.
    Uncertain {
        /// That execution's id.
        execution_id: Arc<str>,
    },
    /// The store is full of running executions.
    Full,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reservation::Reserved => f.write_str("Reserved"),
            Reservation::Finished(response) => f.debug_tuple("Finished").field(response).finish(),
            Reservation::Running { execution_id, .. } => f
                .debug_struct("Running")
                .field("execution_id", execution_id)
                .finish_non_exhaustive(),
            Reservation::Conflict { tool } => {
                f.debug_struct("Conflict").field("tool", tool).finish()
            }
            Reservation::Uncertain { execution_id } => f
                .debug_struct("Uncertain")
                .field("execution_id", execution_id)
                .finish(),
            Reservation::Full => f.write_str("Full"),
        }
    }
}

/// How a reserved execution ended, for [`IdempotencyStore::finish`]. It borrows the answer:
/// a store copies what it keeps, and the caller still holds the answer to send it.
#[derive(Debug, Clone, Copy)]
pub enum Finish<'a> {
    /// Keep the response: retries replay it.
    Response(&'a StoredResponse),
    /// A non-idempotent write was interrupted: retries get `EXECUTION_UNCERTAIN`.
    Uncertain {
        /// The interrupted execution's id.
        execution_id: &'a Arc<str>,
    },
}

impl<'a> Finish<'a> {
    /// The execution that reserved the key and now finishes it.
    pub fn execution_id(&self) -> &'a Arc<str> {
        match self {
            Finish::Response(response) => &response.execution_id,
            Finish::Uncertain { execution_id } => execution_id,
        }
    }
}

/// A store failed (connection lost, timeout), or could not be opened. At request time it is
/// answered as a retryable `503`, never by running the tool without a record.
///
/// Its message carries the whole chain of causes (a TLS handshake fails *because* the
/// certificate names another host), so a log line of it says what went wrong.
#[derive(Debug)]
pub struct StoreError(pub Box<dyn std::error::Error + Send + Sync>);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "idempotency store error: {}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl std::error::Error for StoreError {}

impl StoreError {
    /// An error that is only a message (a record the store cannot read, a bad URL).
    pub(crate) fn message(message: impl Into<String>) -> Self {
        StoreError(message.into().into())
    }
}

/// Where idempotency records live: in memory ([`MemoryStore`], the default) or in a shared
/// engine so that replicas see each other's records.
///
/// Every method acts atomically on one key.
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `key` for a new execution of `fingerprint`, or reports what holds it. Finished
    /// records older than `ttl` count as absent.
    ///
    /// The claim holds for `lease` (the execution's deadline and a margin), whatever the `ttl`:
    /// a running record never expires before its lease. One whose lease has passed belongs to
    /// an execution that will never finish it (its replica crashed), so it turns into an
    /// uncertain record carrying that execution's id, kept for `ttl` after the lease.
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>>;

    /// Records how the execution that reserved `key` ended; the record expires `ttl` later.
    /// Ignored when the record no longer belongs to that execution (released, or expired and
    /// claimed again).
    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Frees `key` if the execution `execution_id` still holds it: nothing is kept, a retry
    /// runs again. An execution whose record was taken over (its lease passed, the record
    /// expired and another execution claimed the key) frees nothing: fencing by execution id.
    /// Also how a host clears an uncertain record once it has checked what happened, with the
    /// execution id the record reports.
    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Drops expired records; returns how many. Stores also expire records on their own.
    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>>;

    /// Whether the store keeps executions for their callers (`protocol.md` §9): lookups,
    /// re-attachment, cancellation, the list. A store that does not answers calls as before and
    /// offers no async execution. The execution methods below are used only when it does.
    fn keeps_executions(&self) -> bool {
        false
    }

    /// Keeps the execution `execution_id` of `caller`, running, for at least `lease` (its
    /// deadline and a margin); visible to its caller on every replica once this returns.
    fn begin_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a Arc<str>,
        tool: &'a str,
        lease: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (caller, execution_id, tool, lease);
        Box::pin(std::future::ready(Err(executions_not_kept())))
    }

    /// Adds a progress event to a running execution, keeping the latest [`KEPT_PROGRESS`].
    fn record_progress<'a>(
        &'a self,
        execution_id: &'a str,
        event: RecordedEvent,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (execution_id, event);
        Box::pin(std::future::ready(Err(executions_not_kept())))
    }

    /// Records how the execution ended; it is kept `ttl` longer.
    fn end_execution<'a>(
        &'a self,
        execution_id: &'a str,
        outcome: RecordedOutcome,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (execution_id, outcome, ttl);
        Box::pin(std::future::ready(Err(executions_not_kept())))
    }

    /// The execution `execution_id` if `caller` started it; `None` for anyone else, exactly as
    /// for an id that does not exist.
    fn execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<ExecutionRecord>, StoreError>> {
        let _ = (caller, execution_id);
        Box::pin(std::future::ready(Err(executions_not_kept())))
    }

    /// The caller's executions that match `query`, newest first.
    fn executions<'a>(
        &'a self,
        caller: &'a str,
        query: &'a ExecutionQuery,
    ) -> BoxFuture<'a, Result<Vec<ExecutionSummary>, StoreError>> {
        let _ = (caller, query);
        Box::pin(std::future::ready(Err(executions_not_kept())))
    }

    /// Asks for the caller's running execution to be cancelled; the replica running it learns
    /// it through [`IdempotencyStore::execution_changed`].
    fn cancel_execution<'a>(
        &'a self,
        caller: &'a str,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Cancellation, StoreError>> {
        let _ = (caller, execution_id);
        Box::pin(std::future::ready(Err(executions_not_kept())))
    }

    /// Resolves when the execution may have changed (an event, its end, a cancellation
    /// request), or after a short interval: readers then look again.
    fn execution_changed(&self, execution_id: &str) -> BoxFuture<'static, ()> {
        let _ = execution_id;
        Box::pin(tokio::time::sleep(Duration::from_millis(250)))
    }

    /// Checks that the store answers, for the health checks (run in the background, never per
    /// request). `None`, the default, for a store in the process: nothing to check.
    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        None
    }

    /// Whether the store keeps event subscriptions and the outbox (`protocol.md` §8). The
    /// event methods below are used only when it does.
    fn keeps_events(&self) -> bool {
        false
    }

    /// Saves `subscription`, replacing the one with its id.
    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = subscription;
        Box::pin(std::future::ready(Err(events_not_kept())))
    }

    /// The subscription `id`.
    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        let _ = id;
        Box::pin(std::future::ready(Err(events_not_kept())))
    }

    /// Every subscription, oldest first.
    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        Box::pin(std::future::ready(Err(events_not_kept())))
    }

    /// Deletes the subscription `id` with its pending deliveries and its attempts; whether it
    /// existed.
    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let _ = id;
        Box::pin(std::future::ready(Err(events_not_kept())))
    }

    /// Writes `event` with one delivery per subscription of `subscription_ids`, each due now;
    /// durable (as the store is) once this returns. The subscriptions need not be in the store
    /// (those of the configuration file are not).
    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (event, subscription_ids);
        Box::pin(std::future::ready(Err(events_not_kept())))
    }

    /// Claims up to `limit` deliveries that are due and unclaimed (or whose claim's lease has
    /// passed: its replica died), the earliest due first, each for `lease`. Replicas claiming
    /// together never get the same delivery.
    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        let _ = (limit, lease);
        Box::pin(std::future::ready(Err(events_not_kept())))
    }

    /// Logs `attempt` of a claimed delivery (the latest [`KEPT_ATTEMPTS`] per subscription are
    /// kept), then removes the delivery or schedules its next attempt, as `after` says. With a
    /// stale claim (another replica claimed the delivery since) only the log changes.
    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (claimed, attempt, after);
        Box::pin(std::future::ready(Err(events_not_kept())))
    }

    /// The latest `limit` attempts of deliveries to `subscription_id`, newest first.
    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        let _ = (subscription_id, limit);
        Box::pin(std::future::ready(Err(events_not_kept())))
    }

    /// How many deliveries wait in the outbox, due or not (its size is bounded).
    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(std::future::ready(Err(events_not_kept())))
    }
}

/// A shared store (`connect` returns one) is a store too.
impl<S: IdempotencyStore + ?Sized> IdempotencyStore for Arc<S> {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        (**self).reserve(key, fingerprint, execution_id, lease, ttl)
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).finish(key, finish, ttl)
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).release(key, execution_id)
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        (**self).purge_expired()
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        (**self).ping()
    }

    fn keeps_executions(&self) -> bool {
        (**self).keeps_executions()
    }

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

    fn keeps_events(&self) -> bool {
        (**self).keeps_events()
    }

    fn save_subscription<'a>(
        &'a self,
        subscription: &'a StoredSubscription,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).save_subscription(subscription)
    }

    fn subscription<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<StoredSubscription>, StoreError>> {
        (**self).subscription(id)
    }

    fn subscriptions(&self) -> BoxFuture<'_, Result<Vec<StoredSubscription>, StoreError>> {
        (**self).subscriptions()
    }

    fn delete_subscription<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).delete_subscription(id)
    }

    fn enqueue_event<'a>(
        &'a self,
        event: &'a OutboxEvent,
        subscription_ids: &'a [Arc<str>],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).enqueue_event(event, subscription_ids)
    }

    fn claim_deliveries(
        &self,
        limit: usize,
        lease: Duration,
    ) -> BoxFuture<'_, Result<Vec<ClaimedDelivery>, StoreError>> {
        (**self).claim_deliveries(limit, lease)
    }

    fn finish_attempt<'a>(
        &'a self,
        claimed: &'a ClaimedDelivery,
        attempt: &'a DeliveryAttempt,
        after: AfterAttempt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).finish_attempt(claimed, attempt, after)
    }

    fn delivery_attempts<'a>(
        &'a self,
        subscription_id: &'a str,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<DeliveryAttempt>, StoreError>> {
        (**self).delivery_attempts(subscription_id, limit)
    }

    fn pending_deliveries(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        (**self).pending_deliveries()
    }
}

fn executions_not_kept() -> StoreError {
    StoreError::message("this store does not keep executions")
}

fn events_not_kept() -> StoreError {
    StoreError::message("this store does not keep event subscriptions or an outbox")
}
