//! Storage: one contract per concern, and the engines that keep them.
//!
//! - [`KeyStore`]: idempotency records, how a retried call with the same `request_id` gets the
//!   first call's answer instead of running twice (`protocol.md` §4);
//! - [`ExecutionStore`]: executions kept for their callers (`protocol.md` §9);
//! - [`EventStore`]: event subscriptions and the outbox (`protocol.md` §8);
//! - [`ApprovalStore`]: calls held until a person decides, and [`ConsentStore`]: callers'
//!   standing consents (`protocol.md` §12).
//!
//! Each contract is designed for shared engines: every transition is one atomic operation, and
//! a reader waiting on a change either hears a notification (in-process stores, announcements)
//! or polls.
//!
//! An [`Engine`] keeps all three: [`MemoryStore`] (the default), and behind cargo features
//! `PostgresStore` (`postgres`), `RedisStore` (`redis`) and `FileStore` (`file`). [`connect`]
//! picks one by URL. A host may implement one contract alone and take the others from an
//! engine ([`App::key_store`](crate::App::key_store) and its siblings).

#[cfg(any(feature = "postgres", feature = "redis"))]
mod announcements;
mod approvals;
mod connect;
mod consents;
mod error;
mod executions;
#[cfg(feature = "file")]
mod file;
mod keys;
mod memory;
mod options;
mod outbox;
#[cfg(feature = "postgres")]
mod postgres;
mod process_executions;
#[cfg(any(feature = "postgres", feature = "redis", feature = "file"))]
pub(crate) mod record;
#[cfg(feature = "redis")]
pub(crate) mod redis;
mod stores;

pub use approvals::{
    Actor, Approval, ApprovalQuery, ApprovalStatus, ApprovalStep, ApprovalStore, Decided, Verdict,
};
pub use connect::{IDEMPOTENCY_URL_VAR, connect, connect_from_env, connect_with};
pub use consents::{Consent, ConsentStep, ConsentStore};
pub use error::StoreError;
pub use executions::{
    Cancellation, ExecutionQuery, ExecutionRecord, ExecutionState, ExecutionStore,
    ExecutionSummary, KEPT_PROGRESS, RecordedEvent, RecordedOutcome,
};
#[cfg(feature = "file")]
pub use file::FileStore;
pub use keys::{Fingerprint, Finish, IdempotencyKey, KeyStore, Reservation, StoredResponse};
pub use memory::MemoryStore;
pub use options::StoreOptions;
pub use outbox::{
    AfterAttempt, ClaimedDelivery, DeliveryAttempt, EventStore, KEPT_ATTEMPTS, OutboxEvent,
    StoredSubscription,
};
#[cfg(feature = "postgres")]
pub use postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use redis::RedisStore;

pub(crate) use process_executions::ProcessExecutions;
pub(crate) use stores::{StoreChoice, Stores};

/// A whole engine: it keeps idempotency records, executions and events. Every type that
/// implements the three contracts is one; [`connect`] returns one, and
/// [`App::store`](crate::App::store) runs every concern on it.
pub trait Engine: KeyStore + ExecutionStore + EventStore {}

impl<S: KeyStore + ExecutionStore + EventStore> Engine for S {}
