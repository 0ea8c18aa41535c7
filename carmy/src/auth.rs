//! Who is calling, decided on the server side from the request head: an [`Authenticator`] on
//! the builder, or host middleware that inserts a [`Principal`] into the request's extensions.
//! The request body never carries identity.

use axum::http::request::Parts;
use futures_util::future::BoxFuture;

use crate::context::Principal;
use crate::tool_error::{ToolError, codes};

/// Maps a request head to the caller.
///
/// Return `Ok(None)` when the request carries no credentials (the caller is anonymous), and an
/// error from [`unauthenticated`] when it carries credentials that do not verify: a bad
/// credential is refused, never downgraded to anonymous.
pub trait Authenticator: Send + Sync + 'static {
    /// Decides who sent `request`.
    fn authenticate<'a>(
        &'a self,
        request: &'a Parts,
    ) -> BoxFuture<'a, Result<Option<Principal>, ToolError>>;
}

/// The refusal of credentials that do not verify: `401 UNAUTHENTICATED`, with a
/// `WWW-Authenticate` challenge.
pub fn unauthenticated(message: impl Into<std::borrow::Cow<'static, str>>) -> ToolError {
    ToolError::permission(codes::UNAUTHENTICATED, message)
}

/// The caller of `request`: the principal host middleware attached, else the authenticator's
/// verdict, else anonymous.
pub(crate) async fn principal_of(
    request: &Parts,
    authenticator: Option<&dyn Authenticator>,
) -> Result<Principal, ToolError> {
    if let Some(principal) = request.extensions.get::<Principal>() {
        return Ok(principal.clone());
    }
    match authenticator {
        Some(authenticator) => Ok(authenticator
            .authenticate(request)
            .await?
            .unwrap_or_default()),
        None => Ok(Principal::anonymous()),
    }
}
