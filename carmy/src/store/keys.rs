//! The idempotency keys' contract: how a retried call with the same `request_id` gets the first
//! call's answer instead of running twice (`protocol.md` §4, the idempotency table).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;

use super::StoreError;
use crate::status::ExecutionStatus;
use crate::tool_error::Category;

/// Who asked and with which `request_id`: records are kept per caller.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey {
    pub(super) caller: Arc<str>,
    pub(super) request_id: Arc<str>,
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
///
/// Non-exhaustive: made with [`Fingerprint::new`], so a field can be added without breaking a
/// store that reads these.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Fingerprint {
    /// The tool's name (reported when a key is reused for another call).
    pub tool: Arc<str>,
    /// SHA-256 of the tool name and the canonical arguments.
    pub digest: [u8; 32],
}

impl Fingerprint {
    /// The fingerprint of a call to `tool` whose canonical arguments hash to `digest`.
    pub fn new(tool: impl Into<Arc<str>>, digest: [u8; 32]) -> Self {
        Fingerprint {
            tool: tool.into(),
            digest,
        }
    }
}

/// A finished execution's answer, kept so a retry gets it byte for byte.
///
/// Non-exhaustive: made with [`StoredResponse::new`] (a store reading one back, too).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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

impl StoredResponse {
    /// The answer `body` of the execution `execution_id`, which ended with `status`; with the
    /// error's `category` and `code` when it failed.
    pub fn new(
        execution_id: impl Into<Arc<str>>,
        status: ExecutionStatus,
        category: Option<Category>,
        code: Option<Arc<str>>,
        body: Bytes,
    ) -> Self {
        StoredResponse {
            execution_id: execution_id.into(),
            status,
            category,
            code,
            body,
        }
    }
}

/// What [`KeyStore::reserve`] found.
///
/// Exhaustive on purpose: the runtime answers each case differently, so a new case is a new
/// contract, not a detail a store may add.
pub enum Reservation {
    /// The key was free and is now held by this execution: run the tool, then
    /// [`KeyStore::finish`] or [`KeyStore::release`].
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

/// How a reserved execution ended, for [`KeyStore::finish`]. It borrows the answer: a store
/// copies what it keeps, and the caller still holds the answer to send it.
///
/// Exhaustive on purpose: a store keeps each case its own way.
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

/// Where idempotency records live: in memory ([`MemoryStore`](super::MemoryStore), the
/// default) or in a shared engine so that replicas see each other's records. A host may
/// implement this alone and take executions and events from another engine
/// ([`App::key_store`](crate::App::key_store)).
///
/// Every method acts atomically on one key.
pub trait KeyStore: Send + Sync + 'static {
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

    /// Checks that the store answers, for the health checks (run in the background, never per
    /// request). `None`, the default, for a store in the process: nothing to check.
    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        None
    }
}

/// A shared store (`connect` returns one) is a store too.
impl<S: KeyStore + ?Sized> KeyStore for Arc<S> {
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
}
