//! Who is calling, decided on the server side from the request head: an [`Authenticator`] on
//! the builder, or host middleware that inserts a [`Principal`] into the request's extensions.
//! The request body never carries identity.

use std::sync::Arc;

use axum::http::header::AUTHORIZATION;
use axum::http::request::Parts;
use futures_util::future::BoxFuture;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::context::Principal;
use crate::error::Error;
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

/// Who decides the caller of a request: the configuration's tokens, answered at once, or the
/// host's [`Authenticator`], awaited (a boxed future on every request).
#[derive(Clone)]
pub(crate) enum Authentication {
    Tokens(Arc<TokenAuthenticator>),
    Host(Arc<dyn Authenticator>),
}

/// The caller of `request`: the principal host middleware attached, else the authentication's
/// verdict, else anonymous. `authorized`: the request carries `Authorization`.
pub(crate) async fn principal_of(
    request: &Parts,
    authentication: Option<&Authentication>,
    authorized: bool,
) -> Result<Principal, ToolError> {
    if let Some(principal) = request.extensions.get::<Principal>() {
        return Ok(principal.clone());
    }
    let verdict = match authentication {
        Some(Authentication::Tokens(tokens)) if authorized => tokens.verdict(request)?,
        Some(Authentication::Host(authenticator)) => authenticator.authenticate(request).await?,
        // Without `Authorization`, the tokens have nothing to check.
        Some(Authentication::Tokens(_)) | None => None,
    };
    Ok(verdict.unwrap_or_default())
}

/// How configuration stores a token: `sha256:` and the hex SHA-256 of the token, so the file
/// never holds a usable credential. The shell equivalent:
/// `printf %s "$TOKEN" | sha256sum`.
///
/// ```
/// assert_eq!(
///     carmy::auth::hash_token("secret"),
///     "sha256:2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b",
/// );
/// ```
pub fn hash_token(token: &str) -> String {
    format!("{DIGEST_PREFIX}{}", hex(&Sha256::digest(token.as_bytes())))
}

const DIGEST_PREFIX: &str = "sha256:";

/// The built-in [`Authenticator`]: bearer tokens (API keys) from configuration, each mapped to
/// a caller. Only digests are kept, compared in constant time; tokens are never logged.
///
/// `Authorization: Bearer <token>` with a known token is that token's caller; no
/// `Authorization` header is anonymous; anything else is refused with `401`.
#[derive(Default, Clone, PartialEq, Eq)]
pub struct TokenAuthenticator {
    tokens: Vec<([u8; 32], Principal)>,
}

impl std::fmt::Debug for TokenAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The digests stay out of logs too.
        f.debug_struct("TokenAuthenticator")
            .field("tokens", &self.tokens.len())
            .finish()
    }
}

impl TokenAuthenticator {
    /// An authenticator that knows no token yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts the token whose [`hash_token`] is `digest` (`sha256:<64 hex digits>`) as
    /// `principal`, whose id must not be `anonymous` (in any case), the id of callers without
    /// credentials: [`Error::ReservedTokenId`].
    pub fn token(mut self, digest: &str, principal: Principal) -> Result<Self, Error> {
        if crate::principal::is_reserved_id(principal.id()) {
            return Err(Error::ReservedTokenId {
                id: principal.id().to_owned(),
            });
        }
        let digest = parse_digest(digest).ok_or_else(|| Error::InvalidTokenDigest {
            id: principal.id().to_owned(),
        })?;
        self.tokens.push((digest, principal));
        Ok(self)
    }

    /// The caller of `request`: anonymous without `Authorization`, refused with a token that
    /// is not known.
    fn verdict(&self, request: &Parts) -> Result<Option<Principal>, ToolError> {
        match request.headers.get(AUTHORIZATION) {
            None => Ok(None),
            Some(value) => bearer_token(value.as_bytes())
                .and_then(|token| self.verify(token))
                .cloned()
                .map(Some)
                .ok_or_else(|| unauthenticated("the bearer token is not valid")),
        }
    }

    /// The caller whose token is `token`: every digest is compared, so the time taken does not
    /// depend on which one matches, or how much of one.
    fn verify(&self, token: &[u8]) -> Option<&Principal> {
        let digest: [u8; 32] = Sha256::digest(token).into();
        let mut found = None;
        for (known, principal) in &self.tokens {
            if bool::from(known[..].ct_eq(&digest[..])) {
                found = Some(principal);
            }
        }
        found
    }
}

impl Authenticator for TokenAuthenticator {
    fn authenticate<'a>(
        &'a self,
        request: &'a Parts,
    ) -> BoxFuture<'a, Result<Option<Principal>, ToolError>> {
        Box::pin(std::future::ready(self.verdict(request)))
    }
}

/// The token of an `Authorization: Bearer <token>` value (the scheme is case-insensitive).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, token) = value.split_at_checked(7)?;
    (scheme.eq_ignore_ascii_case(b"bearer ") && !token.is_empty()).then_some(token)
}

fn parse_digest(digest: &str) -> Option<[u8; 32]> {
    let hex = digest.strip_prefix(DIGEST_PREFIX)?;
    if hex.len() != 64 {
        return None;
    }
    let mut bytes = [0; 32];
    for (byte, pair) in bytes.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(bytes)
}

/// Lowercase hex, as digests are written.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut out, byte| {
            let _ = write!(out, "{byte:02x}");
            out
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_forms() {
        assert_eq!(bearer_token(b"Bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"bearer abc"), Some(&b"abc"[..]));
        assert_eq!(bearer_token(b"Bearer "), None);
        assert_eq!(bearer_token(b"Basic abc"), None);
        assert_eq!(bearer_token(b"Bear"), None);
    }

    #[test]
    fn digests_parse_only_in_their_documented_form() {
        let digest = hash_token("t");
        assert_eq!(
            parse_digest(&digest),
            Some(<[u8; 32]>::from(Sha256::digest(b"t")))
        );
        assert_eq!(parse_digest(&digest[7..]), None);
        assert_eq!(parse_digest(&digest[..70]), None);
        assert_eq!(parse_digest(&digest.replace('a', "g")), None);
    }
}
