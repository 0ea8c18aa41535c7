//! The approvals' contract (`protocol.md` §12): a call held until a person decides, decided
//! once (the first decision wins on every replica), then run once.
//!
//! An approval is written whole when the call is held; every later change is one atomic
//! transition of its status (or of its run's claim) that also appends a step to its history.
//! Engines keep the approval as a document beside the few fields the transitions compare.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::StoreError;

/// How long a reader waits, by default, before looking at an approval again.
const RECHECK: Duration = Duration::from_millis(250);

/// Where an approval is.
///
/// Exhaustive on purpose: its cases are the protocol's states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalStatus {
    /// Waiting for a decision.
    Pending,
    /// A person approved it: the call runs (once).
    Approved,
    /// A person rejected it: the call never runs.
    Rejected,
    /// Nobody decided before it expired: the call never runs.
    Expired,
    /// Its caller withdrew the call: it never runs.
    Cancelled,
}

impl ApprovalStatus {
    /// Every status, in the order of the protocol.
    pub const ALL: [ApprovalStatus; 5] = [
        ApprovalStatus::Pending,
        ApprovalStatus::Approved,
        ApprovalStatus::Rejected,
        ApprovalStatus::Expired,
        ApprovalStatus::Cancelled,
    ];

    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Cancelled => "cancelled",
        }
    }

    /// The status whose wire name is `name`.
    pub fn from_wire(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|status| status.as_str() == name)
    }
}

/// Who acted on an approval: a caller's id and trust level (its wire name).
///
/// Non-exhaustive: made with [`Actor::new`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Actor {
    /// The caller's principal id.
    pub id: String,
    /// The caller's trust level: `anonymous`, `known`, `partner` or `internal`.
    pub trust: String,
}

impl Actor {
    /// The caller `id`, trusted at `trust`.
    pub fn new(id: impl Into<String>, trust: impl Into<String>) -> Self {
        Actor {
            id: id.into(),
            trust: trust.into(),
        }
    }
}

/// One step of an approval's life, for its history.
///
/// Non-exhaustive: made with [`ApprovalStep::new`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ApprovalStep {
    /// `requested`, `approved`, `rejected`, `expired`, `cancelled` or `started`.
    pub event: String,
    /// Who did it (none for an expiry).
    pub by: Option<Actor>,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What the person who decided said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
}

impl ApprovalStep {
    /// `event`, done by `by` at `at_ms`, with its `comment`.
    pub fn new(
        event: impl Into<String>,
        by: Option<Actor>,
        at_ms: u64,
        comment: Option<String>,
    ) -> Self {
        ApprovalStep {
            event: event.into(),
            by,
            at_ms,
            comment,
        }
    }
}

/// A held call: what it asks, who asked, under which rule, and how it is decided.
///
/// Non-exhaustive: the engine that holds a call makes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Approval {
    /// `apr_` and a UUID v7.
    pub id: String,
    /// The execution the call will be (or was) once decided.
    pub execution_id: String,
    /// The tool called.
    pub tool: String,
    /// The arguments, frozen as the caller sent them.
    pub arguments: Value,
    /// `sha256:` and the hex SHA-256 of the JCS form of `{"tool", "arguments"}`.
    pub arguments_digest: String,
    /// Who called: the call runs as this caller once approved.
    pub caller: Actor,
    /// The caller's permissions when it called, which the run keeps.
    #[serde(default)]
    pub caller_permissions: Vec<String>,
    /// The call's `request_id`, if it sent one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// The policy that held it, or `required`.
    pub policy: String,
    /// Why it was held, in the policy's words.
    pub reason: String,
    /// Who may decide: trust level names (that level and above) and `permission:<name>`.
    pub approvers: Vec<String>,
    /// Whether the caller may decide its own call.
    #[serde(default)]
    pub allow_self_approval: bool,
    /// Where it is.
    pub status: ApprovalStatus,
    /// When it was held, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// When it expires if nobody decides, likewise.
    pub expires_at_ms: u64,
    /// How long the record is kept once decided (the execution record's ttl), in
    /// milliseconds.
    pub keep_ms: u64,
    /// Its history, oldest first: requested, then the decision or the expiry, then the run.
    pub history: Vec<ApprovalStep>,
    /// Once approved: whether its run has started (it runs once, on one replica).
    #[serde(default)]
    pub started: bool,
}

impl Approval {
    /// The step that decided it (approved, rejected, expired or cancelled), if any.
    pub fn decision(&self) -> Option<&ApprovalStep> {
        self.history.iter().find(|step| {
            matches!(
                step.event.as_str(),
                "approved" | "rejected" | "expired" | "cancelled"
            )
        })
    }
}

/// What an approval becomes when someone decides it.
///
/// Exhaustive on purpose: a person approves or rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Run the call.
    Approve,
    /// Never run it.
    Reject,
    /// The caller withdraws it.
    Cancel,
}

impl Verdict {
    /// The status it leads to.
    pub const fn status(self) -> ApprovalStatus {
        match self {
            Verdict::Approve => ApprovalStatus::Approved,
            Verdict::Reject => ApprovalStatus::Rejected,
            Verdict::Cancel => ApprovalStatus::Cancelled,
        }
    }
}

/// What a decision found.
///
/// Exhaustive on purpose: the protocol answers each case differently.
#[derive(Debug, Clone, PartialEq)]
pub enum Decided {
    /// This decision was the first: the approval as it is now.
    Done(Approval),
    /// Another decision came first (or the call was withdrawn): the approval as it is.
    AlreadyDecided(Approval),
    /// It expired before this decision: the approval, expired.
    Expired(Approval),
    /// No approval has that id.
    NotFound,
}

/// Which approvals to list, newest first.
///
/// Non-exhaustive: made with [`ApprovalQuery::new`], then narrowed through its fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ApprovalQuery {
    /// Only those in this status.
    pub status: Option<ApprovalStatus>,
    /// Only those of this tool.
    pub tool: Option<String>,
    /// Only those of this caller.
    pub caller: Option<String>,
    /// Only those older than this approval id (the previous page's last).
    pub before: Option<String>,
    /// At most this many.
    pub limit: usize,
}

impl ApprovalQuery {
    /// The `limit` newest approvals, whatever their status, tool and caller.
    pub fn new(limit: usize) -> Self {
        ApprovalQuery {
            limit,
            ..ApprovalQuery::default()
        }
    }
}

/// Where held calls wait for a person (`protocol.md` §12). Every shipped engine keeps them; a
/// host that implements only some other contract gets them from the in-memory engine.
///
/// Times are milliseconds since the Unix epoch, given by the caller, so that every replica
/// agrees on expiry without trusting the engine's clock.
pub trait ApprovalStore: Send + Sync + 'static {
    /// Saves a new pending approval; visible on every replica once this returns.
    fn create<'a>(&'a self, approval: &'a Approval) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The approval `id`, whoever may see it (the caller of this method decides).
    fn approval<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Approval>, StoreError>>;

    /// The approval that holds (or held) the execution `execution_id`.
    fn approval_of<'a>(
        &'a self,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>>;

    /// The newest approval of the same call: the same caller, tool and arguments digest.
    fn same_call<'a>(
        &'a self,
        caller: &'a str,
        tool: &'a str,
        arguments_digest: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>>;

    /// The approvals that match `query`, newest first.
    fn approvals<'a>(
        &'a self,
        query: &'a ApprovalQuery,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>>;

    /// Decides the approval `id` if it is pending and `now_ms` is before its expiry, in one
    /// atomic step: the first decision wins across replicas. The step (with its actor and
    /// comment) is appended to the history. An approval approved here is claimed for its run
    /// until `now_ms + lease_ms`, by the replica that will start it. A pending approval past
    /// its expiry is marked expired instead, and [`Decided::Expired`] answered.
    fn decide<'a>(
        &'a self,
        id: &'a str,
        verdict: Verdict,
        step: &'a ApprovalStep,
        now_ms: u64,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<Decided, StoreError>>;

    /// Marks up to `limit` pending approvals whose expiry is at or before `now_ms` as expired,
    /// each with an `expired` step; returns them. Replicas expiring together never get the
    /// same approval.
    fn expire<'a>(
        &'a self,
        now_ms: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>>;

    /// Up to `limit` approved approvals whose run has not started: those not claimed, or whose
    /// claim ended before `now_ms` (the replica that claimed them died). Each is claimed until
    /// `now_ms + lease_ms`; replicas claiming together never get the same one.
    fn claim_approved<'a>(
        &'a self,
        now_ms: u64,
        lease_ms: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>>;

    /// Marks the approved approval `id` as started, appending `step`, if nobody started it:
    /// `true` when this call did (the caller runs it, once), `false` otherwise.
    fn start<'a>(
        &'a self,
        id: &'a str,
        step: &'a ApprovalStep,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Drops approvals decided (or expired) longer ago than they are kept; returns how many.
    fn purge_approvals(&self, now_ms: u64) -> BoxFuture<'_, Result<usize, StoreError>>;

    /// Resolves when the approval may have changed, or after a short interval: readers then
    /// look again.
    fn approval_changed(&self, id: &str) -> BoxFuture<'static, ()> {
        let _ = id;
        Box::pin(tokio::time::sleep(RECHECK))
    }
}

/// A shared store (`connect` returns one) is a store too.
impl<S: ApprovalStore + ?Sized> ApprovalStore for Arc<S> {
    fn create<'a>(&'a self, approval: &'a Approval) -> BoxFuture<'a, Result<(), StoreError>> {
        (**self).create(approval)
    }

    fn approval<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Approval>, StoreError>> {
        (**self).approval(id)
    }

    fn approval_of<'a>(
        &'a self,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>> {
        (**self).approval_of(execution_id)
    }

    fn same_call<'a>(
        &'a self,
        caller: &'a str,
        tool: &'a str,
        arguments_digest: &'a str,
    ) -> BoxFuture<'a, Result<Option<Approval>, StoreError>> {
        (**self).same_call(caller, tool, arguments_digest)
    }

    fn approvals<'a>(
        &'a self,
        query: &'a ApprovalQuery,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>> {
        (**self).approvals(query)
    }

    fn decide<'a>(
        &'a self,
        id: &'a str,
        verdict: Verdict,
        step: &'a ApprovalStep,
        now_ms: u64,
        lease_ms: u64,
    ) -> BoxFuture<'a, Result<Decided, StoreError>> {
        (**self).decide(id, verdict, step, now_ms, lease_ms)
    }

    fn expire<'a>(
        &'a self,
        now_ms: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>> {
        (**self).expire(now_ms, limit)
    }

    fn claim_approved<'a>(
        &'a self,
        now_ms: u64,
        lease_ms: u64,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<Approval>, StoreError>> {
        (**self).claim_approved(now_ms, lease_ms, limit)
    }

    fn start<'a>(
        &'a self,
        id: &'a str,
        step: &'a ApprovalStep,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).start(id, step)
    }

    fn purge_approvals(&self, now_ms: u64) -> BoxFuture<'_, Result<usize, StoreError>> {
        (**self).purge_approvals(now_ms)
    }

    fn approval_changed(&self, id: &str) -> BoxFuture<'static, ()> {
        (**self).approval_changed(id)
    }
}
