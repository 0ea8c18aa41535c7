//! What every request passes before a route sees it, in this order: the protocol version
//! (`Carmy-Version`), the browser origin of a request that changes state, the caller's
//! identity, then the caller's rate limit. A bad version or a foreign origin costs no budget; a
//! bad credential is refused before it can spend anyone's. A header these read may be sent
//! once only.

pub(crate) mod origin;
mod rate_limit;
#[cfg(feature = "redis")]
mod redis;

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, LazyLock};

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
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

use crate::auth::{self, Authentication};
use crate::http::{Known, METRICS_PATH, Present, is_console, is_probe};
use crate::principal::{Principal, TrustLevel};
use crate::settings::{Admitted, Current};
use crate::telemetry::Metrics;
use crate::tool_error::ToolError;
use crate::wire::{
    CARMY_REPLAYED, CARMY_VERSION, IDEMPOTENCY_KEY, LAST_EVENT_ID, MCP_METHOD, MCP_NAME,
    MCP_PROTOCOL_VERSION, MCP_SESSION_ID, X_FORWARDED_FOR, codes,
};

pub use rate_limit::{Decision, MemoryRateLimiter, RateLimit, RateLimiter};
pub(crate) use rate_limit::{Limiter, RateKey};
#[cfg(feature = "redis")]
pub use redis::RedisRateLimiter;

/// The protocol version every response announces.
static SERVED_VERSION: HeaderValue = HeaderValue::from_static("1.0");
/// The major versions a client may ask for.
const SUPPORTED_MAJORS: &[u64] = &[1];

/// The headers of `security_headers`: no sniffing, no framing, no referrer, no active content.
static SECURITY_HEADERS: [(HeaderName, HeaderValue); 4] = [
    (
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    ),
    (
        HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    ),
    (
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    ),
    (
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
    ),
];

/// The gate's headers alone, for an answer that has none of its own.
static GATE_HEADERS: LazyLock<AnswerHeaders> = LazyLock::new(|| AnswerHeaders::new(&[]));

/// Renders a refusal in a transport's own error shape, under a configuration with (`true`) or
/// without security headers.
type Refuse = fn(ToolError, bool) -> Response;

/// MCP's JSON-RPC error under `/mcp`, carmy/1's error envelope everywhere else.
fn refusal_for(path: &str) -> Refuse {
    #[cfg(feature = "mcp")]
    if is_mcp(path) {
        return |error, _| crate::mcp::refusal(&error);
    }
    let _ = path;
    |error, secured| crate::http::error::answer(&error, secured)
}

/// Whether `path` is MCP's, when MCP is served.
fn is_mcp(path: &str) -> bool {
    cfg!(feature = "mcp") && (path == crate::wire::paths::MCP || path.starts_with("/mcp/"))
}

/// How requests are admitted; set through the [`App`](crate::App) builder or `carmy.toml`.
#[derive(Clone)]
pub(crate) struct Protection {
    pub(crate) authentication: Option<Authentication>,
    /// The budget of each trust level, indexed by [`TrustLevel::index`]; `None` is unlimited.
    pub(crate) limits: [Option<RateLimit>; 4],
    pub(crate) limiter: Limiter,
    /// Key anonymous callers by the last `X-Forwarded-For` address (set by a trusted proxy)
    /// instead of the peer address.
    pub(crate) trust_forwarded_for: bool,
    /// Browser origins allowed, one list for carmy/1's CORS, its `Origin` check of requests
    /// that change state, and MCP's, so a preflight never grants what the request is then
    /// refused; empty turns CORS off.
    pub(crate) cors_origins: Vec<String>,
    pub(crate) security_headers: bool,
    /// Counts refusals by a rate limit, when metrics are on.
    pub(crate) metrics: Option<Arc<Metrics>>,
}

impl Default for Protection {
    fn default() -> Self {
        Protection {
            authentication: None,
            limits: [None; 4],
            limiter: Limiter::Memory(MemoryRateLimiter::new()),
            trust_forwarded_for: false,
            cors_origins: Vec::new(),
            security_headers: false,
            metrics: None,
        }
    }
}

impl Protection {
    /// Version, then caller, then budget: the caller, admitted. `arrived`: when the gate took
    /// the request.
    async fn admit(
        &self,
        parts: &Parts,
        present: Present,
        arrived: Instant,
    ) -> Result<Principal, ToolError> {
        if present.has(Known::CarmyVersion) {
            once(&parts.headers, &CARMY_VERSION, "Carmy-Version")?;
            check_version(&parts.headers)?;
        }
        if present.has(Known::Origin) {
            once(&parts.headers, &ORIGIN, "Origin")?;
            self.check_origin(parts)?;
        }
        let authorized = present.has(Known::Authorization);
        if authorized {
            once(&parts.headers, &AUTHORIZATION, "Authorization")?;
        }
        let principal = auth::principal_of(parts, self.authentication.as_ref(), authorized).await?;
        // Probes (`/agent/health…`) and scrapes spend no budget: an orchestrator polls them all
        // day. Nor do the console's files: the same bytes for everyone, from memory.
        let path = parts.uri.path();
        let unmetered = is_probe(path) || path == METRICS_PATH || is_console(path);
        let limit = self.limits[principal.trust().index()].filter(|_| !unmetered);
        if let Some(limit) = limit {
            let decision = {
                let key = self.rate_key(&principal, &parts.headers, &parts.extensions);
                self.limiter.check(key, limit, arrived).await?
            };
            if let Decision::Limited { retry_after } = decision {
                if let Some(metrics) = &self.metrics {
                    metrics.rate_limited(principal.trust());
                }
                return Err(ToolError::capacity(
                    codes::RATE_LIMITED,
                    "too many requests; retry later",
                )
                .retryable(retry_after));
            }
        }
        Ok(principal)
    }

    /// A request that may run something or change state (any method but `GET`, `HEAD` and
    /// `OPTIONS`) from a browser comes from the server's own origin or an allowed one, else it
    /// is refused before it reads anything or spends any budget. `/mcp` applies its own rule.
    fn check_origin(&self, parts: &Parts) -> Result<(), ToolError> {
        let safe = matches!(parts.method, Method::GET | Method::HEAD | Method::OPTIONS);
        if safe || is_mcp(parts.uri.path()) {
            return Ok(());
        }
        match parts.headers.get(ORIGIN) {
            Some(value) if !origin::same_or_allowed(value, &self.cors_origins, parts) => {
                Err(origin::refused())
            }
            _ => Ok(()),
        }
    }

    /// The key a caller's budget is counted under: the principal, or for anonymous callers
    /// the address they connect from.
    pub(crate) fn rate_key<'p>(
        &self,
        principal: &'p Principal,
        headers: &HeaderMap,
        extensions: &axum::http::Extensions,
    ) -> RateKey<'p> {
        if principal.trust() != TrustLevel::Anonymous {
            return RateKey::Principal(principal.id());
        }
        if self.trust_forwarded_for
            && let Some(forwarded) = last_forwarded_for(headers)
        {
            return RateKey::Peer(Some(forwarded));
        }
        // Served without connection info (plain `axum::serve`), anonymous callers share one
        // budget.
        let connected = extensions.get::<ConnectInfo<SocketAddr>>();
        RateKey::Peer(connected.map(|ConnectInfo(addr)| addr.ip()))
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
    let refuse = refusal_for(parts.uri.path());
    let admission = async move {
        let admitted = settings.protection.admit(&parts, present, arrived).await;
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

/// A route that set its own security header (the console's policy) keeps it.
fn add_security_headers(headers: &mut HeaderMap, security_headers: bool) {
    if security_headers {
        for (name, value) in &SECURITY_HEADERS {
            headers.entry(name).or_insert_with(|| value.clone());
        }
    }
}

/// The headers a route's answer starts with, built once: the gate's (see [`guard`]) and then
/// the route's own. A clone is one copy of the map, where every header inserted costs a hash,
/// a probe and an entry, and a map that outgrows its first allocation is allocated again;
/// the gate leaves an answer that already has `Carmy-Version` as it is.
#[derive(Debug)]
pub(crate) struct AnswerHeaders {
    plain: HeaderMap,
    secured: HeaderMap,
}

impl AnswerHeaders {
    /// The gate's headers, then `own`: with every header the route's answer will have, a
    /// placeholder value for those it sets per answer, so that the clone has room for them.
    pub(crate) fn new(own: &[(HeaderName, HeaderValue)]) -> Self {
        let build = |security_headers| {
            let mut headers = HeaderMap::with_capacity(1 + SECURITY_HEADERS.len() + own.len());
            headers.insert(CARMY_VERSION.clone(), SERVED_VERSION.clone());
            add_security_headers(&mut headers, security_headers);
            for (name, value) in own {
                headers.insert(name.clone(), value.clone());
            }
            headers
        };
        AnswerHeaders {
            plain: build(false),
            secured: build(true),
        }
    }

    /// The headers of an answer served under a configuration with `security_headers`.
    pub(crate) fn answer(&self, security_headers: bool) -> HeaderMap {
        if security_headers {
            self.secured.clone()
        } else {
            self.plain.clone()
        }
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

/// The address the nearest proxy saw: the last entry of the last `X-Forwarded-For`.
fn last_forwarded_for(headers: &HeaderMap) -> Option<IpAddr> {
    let value = headers.get_all(&X_FORWARDED_FOR).iter().next_back()?;
    value.to_str().ok()?.rsplit(',').next()?.trim().parse().ok()
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

    #[test]
    fn forwarded_for_takes_the_nearest_proxy() {
        let mut headers = HeaderMap::new();
        headers.append(
            &X_FORWARDED_FOR,
            HeaderValue::from_static("1.1.1.1, 2.2.2.2"),
        );
        assert_eq!(last_forwarded_for(&headers), Some([2, 2, 2, 2].into()));
        headers.append(&X_FORWARDED_FOR, HeaderValue::from_static("3.3.3.3"));
        assert_eq!(last_forwarded_for(&headers), Some([3, 3, 3, 3].into()));
    }
}
