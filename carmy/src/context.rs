//! What a tool knows about the call it serves.

use std::fmt;
use std::sync::{Arc, LazyLock};

use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::runtime::Event;

/// How far a caller is trusted. Ordered: `Anonymous < Known < Partner < Internal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum TrustLevel {
    /// Nobody vouched for the caller.
    #[default]
    Anonymous,
    /// The caller presented valid credentials.
    Known,
    /// A caller from a partner organisation.
    Partner,
    /// A caller from inside the organisation.
    Internal,
}

impl TrustLevel {
    /// Every level, lowest first.
    pub const ALL: [TrustLevel; 4] = [
        TrustLevel::Anonymous,
        TrustLevel::Known,
        TrustLevel::Partner,
        TrustLevel::Internal,
    ];

    /// The level's position in [`TrustLevel::ALL`].
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// The level called `name` (`anonymous`, `known`, `partner` or `internal`).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|level| level.as_str() == name)
    }

    /// The wire and configuration name.
    pub const fn as_str(self) -> &'static str {
        match self {
            TrustLevel::Anonymous => "anonymous",
            TrustLevel::Known => "known",
            TrustLevel::Partner => "partner",
            TrustLevel::Internal => "internal",
        }
    }
}

/// Who is calling, as decided on the server side (authentication middleware or an
/// authenticator), never by the request body.
///
/// Host middleware attaches one with `request.extensions_mut().insert(principal)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    id: Arc<str>,
    trust: TrustLevel,
    permissions: Arc<[Arc<str>]>,
}

impl Principal {
    /// The caller nobody vouched for.
    pub fn anonymous() -> Self {
        // Most calls are anonymous: share one value instead of allocating per request.
        static ANONYMOUS: LazyLock<Principal> = LazyLock::new(|| Principal {
            id: Arc::from("anonymous"),
            trust: TrustLevel::Anonymous,
            permissions: Arc::from([]),
        });
        ANONYMOUS.clone()
    }

    /// A caller identified by `id` (a user or API-key id), trusted at `trust`.
    pub fn new(id: impl Into<Arc<str>>, trust: TrustLevel) -> Self {
        Principal {
            id: id.into(),
            trust,
            permissions: Arc::from([]),
        }
    }

    /// Grants a permission, such as `confirm:cancel_order`.
    #[must_use]
    pub fn with_permission(mut self, permission: impl Into<Arc<str>>) -> Self {
        let mut permissions = self.permissions.to_vec();
        permissions.push(permission.into());
        self.permissions = permissions.into();
        self
    }

    /// The caller's id; idempotency records are kept per id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The caller's id, shared (no copy), for keys kept per caller.
    pub(crate) fn shared_id(&self) -> Arc<str> {
        Arc::clone(&self.id)
    }

    /// The caller's trust level.
    pub fn trust(&self) -> TrustLevel {
        self.trust
    }

    /// Whether the caller holds `permission`.
    pub fn has_permission(&self, permission: &str) -> bool {
        self.permissions.iter().any(|held| &**held == permission)
    }
}

impl Default for Principal {
    fn default() -> Self {
        Self::anonymous()
    }
}

/// A progress report from a tool, streamed to clients that asked for events.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Progress {
    /// Work done so far.
    pub(crate) progress: u64,
    /// Total work, when known.
    pub(crate) total: Option<u64>,
    /// What the tool is doing.
    pub(crate) message: Option<String>,
}

/// What a tool knows about the call it serves: ids, the caller, cancellation, and a way to
/// report progress. Take it as a parameter: `ctx: carmy::Context`.
#[derive(Clone)]
pub struct Context {
    inner: Arc<ContextInner>,
}

struct ContextInner {
    execution_id: Arc<str>,
    request_id: Option<String>,
    principal: Principal,
    cancellation: CancellationToken,
    events: Option<tokio::sync::mpsc::UnboundedSender<Event>>,
    health: Health,
}

impl Context {
    pub(crate) fn new(
        execution_id: Arc<str>,
        request_id: Option<String>,
        principal: Principal,
        cancellation: CancellationToken,
        events: Option<tokio::sync::mpsc::UnboundedSender<Event>>,
        health: Health,
    ) -> Self {
        Context {
            inner: Arc::new(ContextInner {
                execution_id,
                request_id,
                principal,
                cancellation,
                events,
                health,
            }),
        }
    }

    /// This execution's id (`exec_…`).
    pub fn execution_id(&self) -> &str {
        &self.inner.execution_id
    }

    /// The client's `request_id`, when it sent one.
    pub fn request_id(&self) -> Option<&str> {
        self.inner.request_id.as_deref()
    }

    /// Who is calling.
    pub fn principal(&self) -> &Principal {
        &self.inner.principal
    }

    /// Fires when the execution is cancelled (client gone, deadline passed, shutdown). The tool's
    /// future is dropped right after; use the token to stop work handed to other tasks.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.inner.cancellation
    }

    /// The service's health: a tool that finds a dependency broken reports it
    /// (`ctx.health().report_degrading("…")`).
    pub fn health(&self) -> &Health {
        &self.inner.health
    }

    /// Whether the execution has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancellation.is_cancelled()
    }

    /// Reports progress to clients that stream events; a no-op for the others.
    pub fn progress(
        &self,
        done: u64,
        total: impl Into<Option<u64>>,
        message: impl Into<Option<String>>,
    ) {
        if let Some(events) = &self.inner.events {
            // The receiver is gone only once the client is; nothing to report then.
            let _ = events.send(Event::Progress(Progress {
                progress: done,
                total: total.into(),
                message: message.into(),
            }));
        }
    }
}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("execution_id", &self.inner.execution_id)
            .field("request_id", &self.inner.request_id)
            .field("principal", &self.inner.principal.id())
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}
