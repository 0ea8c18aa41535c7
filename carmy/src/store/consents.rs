//! The consents' contract (`protocol.md` §12): a caller's standing consent to a purpose, which
//! tools declared with `consent = "<purpose>"` need on every call, on every replica.
//!
//! A consent is granted and revoked, never deleted before its record expires: its history
//! says when each happened.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::StoreError;

/// One step of a consent's life: `granted` (again, with a new expiry) or `revoked`.
///
/// Non-exhaustive: made with [`ConsentStep::new`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ConsentStep {
    /// `granted` or `revoked`.
    pub event: String,
    /// When, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// For a grant: when it lapses, likewise; `None` while it is not revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
}

impl ConsentStep {
    /// `event` at `at_ms`; a grant's expiry `expires_at_ms`.
    pub fn new(event: impl Into<String>, at_ms: u64, expires_at_ms: Option<u64>) -> Self {
        ConsentStep {
            event: event.into(),
            at_ms,
            expires_at_ms,
        }
    }
}

/// A caller's consent to one purpose, with its history.
///
/// Non-exhaustive: made with [`Consent::new`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Consent {
    /// The caller's principal id.
    pub caller: String,
    /// What the caller consents to, e.g. `marketing`.
    pub purpose: String,
    /// When it was last granted, in milliseconds since the Unix epoch.
    pub granted_at_ms: u64,
    /// When it lapses; `None`: until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Whether it was revoked after its last grant.
    pub revoked: bool,
    /// Its history, oldest first.
    pub history: Vec<ConsentStep>,
}

impl Consent {
    /// `caller`'s consent to `purpose`, granted at `granted_at_ms` until `expires_at_ms`.
    pub fn new(
        caller: impl Into<String>,
        purpose: impl Into<String>,
        granted_at_ms: u64,
        expires_at_ms: Option<u64>,
    ) -> Self {
        Consent {
            caller: caller.into(),
            purpose: purpose.into(),
            granted_at_ms,
            expires_at_ms,
            revoked: false,
            history: vec![ConsentStep::new("granted", granted_at_ms, expires_at_ms)],
        }
    }

    /// Whether it stands at `now_ms`: granted, not revoked, not lapsed.
    pub fn stands(&self, now_ms: u64) -> bool {
        !self.revoked && self.expires_at_ms.is_none_or(|expires| expires > now_ms)
    }
}

/// Where callers' consents live (`protocol.md` §12). Every shipped engine keeps them; a host
/// that implements only some other contract gets them from the in-memory engine.
pub trait ConsentStore: Send + Sync + 'static {
    /// Grants `caller`'s consent to `purpose` from `now_ms` until `expires_at_ms` (`None`:
    /// until revoked), appending a `granted` step to any earlier history; the consent as it is
    /// now. Visible on every replica once this returns.
    fn grant<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
        now_ms: u64,
        expires_at_ms: Option<u64>,
    ) -> BoxFuture<'a, Result<Consent, StoreError>>;

    /// Revokes `caller`'s consent to `purpose` at `now_ms`, appending a `revoked` step; whether
    /// it stood until now. Visible on every replica once this returns.
    fn revoke<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// `caller`'s consent to `purpose`, standing or not, with its history.
    fn consent<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
    ) -> BoxFuture<'a, Result<Option<Consent>, StoreError>>;

    /// Every consent `caller` has given, standing or not, by purpose.
    fn consents<'a>(&'a self, caller: &'a str) -> BoxFuture<'a, Result<Vec<Consent>, StoreError>>;
}

/// A shared store (`connect` returns one) is a store too.
impl<S: ConsentStore + ?Sized> ConsentStore for Arc<S> {
    fn grant<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
        now_ms: u64,
        expires_at_ms: Option<u64>,
    ) -> BoxFuture<'a, Result<Consent, StoreError>> {
        (**self).grant(caller, purpose, now_ms, expires_at_ms)
    }

    fn revoke<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
        now_ms: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        (**self).revoke(caller, purpose, now_ms)
    }

    fn consent<'a>(
        &'a self,
        caller: &'a str,
        purpose: &'a str,
    ) -> BoxFuture<'a, Result<Option<Consent>, StoreError>> {
        (**self).consent(caller, purpose)
    }

    fn consents<'a>(&'a self, caller: &'a str) -> BoxFuture<'a, Result<Vec<Consent>, StoreError>> {
        (**self).consents(caller)
    }
}
