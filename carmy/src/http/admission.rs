//! What every request passes before a route sees it, in this order: the protocol version
//! (`Carmy-Version`), the browser origin of a request that changes state, the caller's
//! identity, then the caller's rate limit. A bad version or a foreign origin costs no budget; a
//! bad credential is refused before it can spend anyone's. A header these read may be sent
//! once only.

use std::future::Future;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::Entry;
use axum::http::header::{AUTHORIZATION, ORIGIN};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::response::Response;
use futures_util::FutureExt;
use futures_util::future::Either;
use serde_json::json;
use tokio::time::Instant;
use tower_http::cors::CorsLayer;

use super::admitted::Admitted;
use super::{Header, Present, is_console, is_probe, origin};
use crate::auth;
use crate::principal::Principal;
use crate::protection::{Decision, Protection};
use crate::settings::Current;
use crate::tool_error::ToolError;
use crate::wire::headers::{GATE_HEADERS, SERVED_VERSION, add_security_headers};
use crate::wire::{
    CARMY_REPLAYED, CARMY_VERSION, IDEMPOTENCY_KEY, LAST_EVENT_ID, MCP_METHOD, MCP_NAME,
    MCP_PROTOCOL_VERSION, MCP_SESSION_ID, codes, paths,
};

/// The major versions a client may ask for.
const SUPPORTED_MAJORS: &[u64] = &[1];

/// Renders a refusal in a transport's own error shape, under a configuration with (`true`) or
/// without security headers.
pub(crate) type Refuse = fn(ToolError, bool) -> Response;

/// How a transport's routes are admitted: carmy/1's by default; MCP renders refusals as
/// JSON-RPC errors and checks origins by its own rule.
#[derive(Clone, Copy)]
pub(crate) struct Admission {
    pub(crate) refuse: Refuse,
    /// carmy/1's origin rule applies: a request that changes state comes from the server's
    /// own origin or an allowed one.
    pub(crate) same_origin: bool,
}

impl Admission {
    /// carmy/1's: the error envelope, and its origin rule.
    pub(crate) const CARMY: Admission = Admission {
        refuse: |error, secured| super::error::answer(&error, secured),
        same_origin: true,
    };
}

/// Version, then caller, then budget: the caller, admitted. `arrived`: when the gate took
/// the request.
async fn admit(
    protection: &Protection,
    admission: Admission,
    parts: &Parts,
    present: Present,
    arrived: Instant,
) -> Result<Principal, ToolError> {
    if present.has(Header::CarmyVersion) {
        once(&parts.headers, &CARMY_VERSION, "Carmy-Version")?;
        check_version(&parts.headers)?;
    }
    if present.has(Header::Origin) {
        once(&parts.headers, &ORIGIN, "Origin")?;
        check_origin(protection, admission, parts)?;
    }
    let authorized = present.has(Header::Authorization);
    if authorized {
        once(&parts.headers, &AUTHORIZATION, "Authorization")?;
    }
    let principal =
        auth::principal_of(parts, protection.authentication.as_ref(), authorized).await?;
    // Probes (`/agent/health…`) and scrapes spend no budget: an orchestrator polls them all
    // day. Nor do the console's files: the same bytes for everyone, from memory.
    let path = parts.uri.path();
    let unmetered = is_probe(path) || path == paths::METRICS || is_console(path);
    let limit = protection.limits[principal.trust().index()].filter(|_| !unmetered);
    if let Some(limit) = limit {
        let decision = {
            let key = protection.rate_key(&principal, &parts.headers, &parts.extensions);
            protection.limiter.check(key, limit, arrived).await?
        };
        if let Decision::Limited { retry_after } = decision {
            if let Some(metrics) = &protection.metrics {
                metrics.rate_limited(principal.trust());
            }
            return Err(
                ToolError::capacity(codes::RATE_LIMITED, "too many requests; retry later")
                    .retryable(retry_after),
            );
        }
    }
    Ok(principal)
}

/// A request that may run something or change state (any method but `GET`, `HEAD` and
/// `OPTIONS`) from a browser comes from the server's own origin or an allowed one, else it
/// is refused before it reads anything or spends any budget. `/mcp` applies its own rule.
fn check_origin(
    protection: &Protection,
    admission: Admission,
    parts: &Parts,
) -> Result<(), ToolError> {
    let safe = matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
    if safe || !admission.same_origin {
        return Ok(());
    }
    match parts.headers.get(ORIGIN) {
        Some(value) if !origin::same_or_allowed(value, &protection.cors_origins, parts) => {
            Err(origin::refused())
        }
        _ => Ok(()),
    }
}

/// The gate every route sits behind: the one read of the configuration a request makes
/// (admission, the route and the response headers all see this snapshot), then admission, whose
/// refusal is rendered in the transport's own error shape; `route` answers an admitted request.
/// The request comes in parts: admission reads them, and an admitted request carries its
/// [`Admitted`] (the snapshot and the caller) to its route.
///
/// `present`: the headers carmy reads that the request carries, found once by the gate;
/// `arrived`: when it took the request.
///
/// Admission owns the parts while it reads them and hands them back; the route's future then
/// takes their place, where an async block would keep them beside it.
pub(crate) fn guard<Route, Answered>(
    current: &Current,
    admission: Admission,
    parts: Parts,
    body: Body,
    present: Present,
    arrived: Instant,
    route: Route,
) -> impl Future<Output = Response> + use<Route, Answered>
where
    Route: FnOnce(Request) -> Answered,
    Answered: Future<Output = Response>,
{
    let settings = current.load_full();
    let security_headers = settings.protection.security_headers;
    let refuse = admission.refuse;
    let admission = async move {
        let admitted = admit(&settings.protection, admission, &parts, present, arrived).await;
        (parts, settings, admitted)
    };
    admission
        .then(move |(mut parts, settings, admitted)| match admitted {
            Ok(principal) => {
                parts.extensions.insert(Admitted {
                    settings,
                    principal,
                    present,
                });
                Either::Left(route(Request::from_parts(parts, body)))
            }
            Err(error) => Either::Right(std::future::ready(refuse(error, security_headers))),
        })
        .map(move |mut response| {
            add_gate_headers(response.headers_mut(), security_headers);
            response
        })
}

/// Every answer gets the version and, when they are on (`secured`), the security headers. One
/// started from [`AnswerHeaders`] has them all already, with the version first: seen without
/// hashing the name to look it up. One without a header of its own (a `204`) takes a copy of
/// them made once. Any other gets them inserted.
fn add_gate_headers(headers: &mut HeaderMap, secured: bool) {
    if headers.keys().next() == Some(&CARMY_VERSION) {
        return;
    }
    if headers.is_empty() {
        *headers = GATE_HEADERS.answer(secured);
    } else if let Entry::Vacant(version) = headers.entry(&CARMY_VERSION) {
        version.insert(SERVED_VERSION.clone());
        add_security_headers(headers, secured);
    }
}

/// A header that a request carries, refused when it carries it more than once: which of two
/// would count is not for carmy to guess (two credentials, two versions, two origins), and a
/// component in front that read the other would see another request.
fn once(headers: &HeaderMap, name: &HeaderName, shown: &str) -> Result<(), ToolError> {
    if headers.get_all(name).iter().nth(1).is_some() {
        return Err(ToolError::invalid_request(format!(
            "the request has more than one {shown}"
        )));
    }
    Ok(())
}

/// `Carmy-Version` is optional; when present it is `1` or `1.<minor>`.
fn check_version(headers: &HeaderMap) -> Result<(), ToolError> {
    let Some(value) = headers.get(&CARMY_VERSION) else {
        return Ok(());
    };
    let malformed =
        || ToolError::invalid_request("Carmy-Version must be a version such as `1` or `1.0`");
    let value = value.to_str().map_err(|_| malformed())?.trim();
    let (major, minor) = value.split_once('.').unwrap_or((value, "0"));
    let number = |part: &str| -> Option<u64> {
        if part.bytes().all(|byte| byte.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    let (Some(major), Some(_)) = (number(major), number(minor)) else {
        return Err(malformed());
    };
    if SUPPORTED_MAJORS.contains(&major) {
        return Ok(());
    }
    Err(ToolError::validation(
        codes::UNSUPPORTED_VERSION,
        format!("carmy/{major} is not served"),
    )
    .recoverable(false)
    .details(json!({ "supported": ["1.0"] })))
}

/// CORS for carmy/1 and `/mcp`, for the origins of the configuration in force. A request with
/// several `Origin`s (which the gate refuses) is granted nothing.
pub(crate) fn cors_layer(current: Current) -> CorsLayer {
    use tower_http::cors::AllowOrigin;
    let allowed = move |origin: &HeaderValue, request: &axum::http::request::Parts| {
        request.headers.get_all(ORIGIN).iter().count() == 1
            && current
                .load()
                .protection
                .cors_origins
                .iter()
                .any(|allowed| allowed.as_bytes().eq_ignore_ascii_case(origin.as_bytes()))
    };
    CorsLayer::new()
        .allow_origin(AllowOrigin::predicate(allowed))
        // DELETE ends an MCP session.
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            axum::http::header::AUTHORIZATION,
            axum::http::header::CONTENT_TYPE,
            axum::http::header::ACCEPT,
            axum::http::header::IF_NONE_MATCH,
            CARMY_VERSION.clone(),
            IDEMPOTENCY_KEY.clone(),
            MCP_SESSION_ID.clone(),
            MCP_PROTOCOL_VERSION.clone(),
            MCP_METHOD.clone(),
            MCP_NAME.clone(),
            LAST_EVENT_ID.clone(),
        ])
        .expose_headers([
            CARMY_VERSION.clone(),
            axum::http::header::ETAG,
            axum::http::header::RETRY_AFTER,
            CARMY_REPLAYED.clone(),
            MCP_SESSION_ID.clone(),
        ])
}

#[cfg(test)]
mod tests {
    use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
    use axum::response::IntoResponse;

    use super::*;
    use crate::wire::headers::{AnswerHeaders, SECURITY_HEADERS};

    fn version(value: &'static str) -> Result<(), String> {
        let mut headers = HeaderMap::new();
        headers.insert(&CARMY_VERSION, HeaderValue::from_static(value));
        check_version(&headers).map_err(|error| error.code().to_owned())
    }

    #[test]
    fn versions() {
        assert_eq!(version("1"), Ok(()));
        assert_eq!(version("1.0"), Ok(()));
        assert_eq!(version("1.5"), Ok(()));
        assert_eq!(version("2"), Err("UNSUPPORTED_VERSION".to_owned()));
        assert_eq!(version("0.9"), Err("UNSUPPORTED_VERSION".to_owned()));
        for garbage in ["", "v1", "1.", ".1", "1.x", "1.0.0", "one"] {
            assert_eq!(
                version(garbage),
                Err("INVALID_REQUEST".to_owned()),
                "{garbage}"
            );
        }
    }

    /// How the gate completed every answer before its headers were made once: the version,
    /// then each security header the route had not set, inserted one by one.
    fn inserted_one_by_one(headers: &mut HeaderMap, secured: bool) {
        if let Entry::Vacant(version) = headers.entry(&CARMY_VERSION) {
            version.insert(SERVED_VERSION.clone());
            for (name, value) in SECURITY_HEADERS.iter().filter(|_| secured) {
                headers.entry(name).or_insert_with(|| value.clone());
            }
        }
    }

    /// Each name with its values, in order; the names sorted, since their order means nothing.
    fn sorted(headers: &HeaderMap) -> Vec<(String, Vec<HeaderValue>)> {
        let mut named: Vec<(String, Vec<HeaderValue>)> = headers
            .keys()
            .map(|name| {
                let values = headers.get_all(name).iter().cloned().collect();
                (name.as_str().to_owned(), values)
            })
            .collect();
        named.sort_by(|one, other| one.0.cmp(&other.0));
        named
    }

    fn map(headers: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn the_gate_adds_the_headers_it_inserted_one_by_one() {
        let answers = [
            map(&[]),
            map(&[
                ("content-type", "application/json"),
                ("cache-control", "no-store"),
            ]),
            // The console's own policy stays.
            map(&[
                ("content-type", "text/html"),
                ("content-security-policy", "default-src 'self'"),
                ("x-content-type-options", "nosniff"),
            ]),
            map(&[
                ("vary", "Accept"),
                ("vary", "Carmy-Channel"),
                ("location", "/x"),
            ]),
            // A route's own version, not first, is left alone.
            map(&[("content-type", "text/plain"), ("carmy-version", "1.0")]),
            // One started from made headers is left as it is.
            AnswerHeaders::new(&[(CONTENT_TYPE, HeaderValue::from_static("text/plain"))])
                .answer(true),
            AnswerHeaders::new(&[]).answer(false),
        ];
        for secured in [false, true] {
            for answer in &answers {
                let (mut made, mut inserted) = (answer.clone(), answer.clone());
                add_gate_headers(&mut made, secured);
                inserted_one_by_one(&mut inserted, secured);
                assert_eq!(sorted(&made), sorted(&inserted), "{answer:?}, {secured}");
                assert_eq!(made.len(), inserted.len());
            }
        }
    }

    #[tokio::test]
    async fn an_envelope_from_made_headers_is_the_one_the_gate_completed() {
        let errors = || {
            [
                ToolError::invalid_request("no"),
                ToolError::capacity(codes::RATE_LIMITED, "too many requests; retry later")
                    .retryable(std::time::Duration::from_millis(1500)),
                auth::unauthenticated("the bearer token is not valid"),
                ToolError::not_found(codes::ROUTE_NOT_FOUND, "no such route").recoverable(false),
            ]
        };
        for secured in [false, true] {
            for (made, completed) in errors().iter().zip(errors()) {
                let made = crate::http::error::answer(made, secured);
                let mut completed = completed.into_response();
                add_gate_headers(completed.headers_mut(), secured);
                assert_eq!(made.status(), completed.status());
                let mut made_headers = made.headers().clone();
                // hyper writes the length of a body that has none; the made answer sets it.
                let length = made_headers.remove(CONTENT_LENGTH).expect("a length");
                assert_eq!(sorted(&made_headers), sorted(completed.headers()));
                assert_eq!(made.headers().keys().next(), Some(&CARMY_VERSION));
                let made = crate::http::whole_body(made.into_body()).await.unwrap();
                let completed = crate::http::whole_body(completed.into_body()).await;
                let completed = completed.unwrap();
                assert_eq!(made, completed);
                assert_eq!(length, HeaderValue::from(made.len()));
            }
        }
    }
}
