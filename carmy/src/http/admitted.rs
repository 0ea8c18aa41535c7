//! What the gate attaches to each request it admits, for the routes behind it.

use std::sync::Arc;

use axum::http::Extensions;
use axum::http::request::Parts;

use super::Present;
use crate::principal::Principal;
use crate::settings::{Current, Settings};

/// What the gate attaches to a request it admits: the configuration snapshot the
/// request is served under, its caller, and which of the headers carmy reads it carries. One
/// extension rather than several: each is an entry of its own, boxed, in the request's
/// extension map.
#[derive(Clone)]
pub(crate) struct Admitted {
    pub(crate) settings: Arc<Settings>,
    pub(crate) principal: Principal,
    pub(crate) present: Present,
}

impl Admitted {
    /// The caller the gate admitted, if `request` passed the gate.
    pub(crate) fn caller(request: &Extensions) -> Option<&Principal> {
        request
            .get::<Admitted>()
            .map(|admitted| &admitted.principal)
    }

    /// The caller the gate admitted, anonymous for a request that did not pass it.
    pub(crate) fn caller_or_anonymous(request: &Extensions) -> Principal {
        Self::caller(request).cloned().unwrap_or_default()
    }

    /// What the gate attached to a request, taken out of it for a route that owns it from
    /// then on (one lookup, nothing cloned); for a request that did not pass the gate, the
    /// configuration in force, an anonymous caller and the headers found now.
    pub(crate) fn take(parts: &mut Parts, current: &Current) -> Admitted {
        parts
            .extensions
            .remove::<Admitted>()
            .unwrap_or_else(|| Admitted {
                settings: current.load_full(),
                principal: Principal::default(),
                present: Present::of(&parts.headers),
            })
    }
}

/// The snapshot the gate attached to a request, else the one in force (a request that did
/// not pass the gate, as on MCP's stdio).
pub(crate) fn settings_of(request: &Extensions, current: &Current) -> Arc<Settings> {
    request.get::<Admitted>().map_or_else(
        || current.load_full(),
        |admitted| Arc::clone(&admitted.settings),
    )
}
