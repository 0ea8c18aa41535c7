//! Who is calling: the caller's identity and trust level, decided on the server side.

use std::sync::{Arc, LazyLock};

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

/// The id of the caller nobody vouched for ([`Principal::anonymous`]).
const ANONYMOUS_ID: &str = "anonymous";

/// Whether `id` may not name a configured caller: it is (or reads as) the id carmy gives
/// anonymous callers, whose idempotency records and executions a caller of that id would share.
/// Ids are compared exactly everywhere, so `Anonymous` would not share them; it is refused all
/// the same, since logs, events and approvals would show it as the anonymous caller.
pub(crate) fn is_reserved_id(id: &str) -> bool {
    id.trim().eq_ignore_ascii_case(ANONYMOUS_ID)
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
            id: Arc::from(ANONYMOUS_ID),
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
