//! The same tools over MCP (feature `mcp`): Streamable HTTP at `/mcp`, for both the stateless
//! 2026-07-28 revision and the `initialize`/`Mcp-Session-Id` generation, and stdio for desktop
//! hosts.
//!
//! The official SDK (`rmcp`) speaks the wire; [`handler`] maps MCP requests onto the runtime.
//! A plain `tools/call`, the bulk of the traffic, stateless or in a session, is answered by
//! [`direct`] with the SDK's types but without its per-request machinery.
//! In front of the SDK, the gate below checks the `Origin` and decides who is calling, on the
//! server side, exactly as for `POST /agent/execute`.

mod direct;
mod handler;
mod manager;
mod sessions;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, ORIGIN, RETRY_AFTER, WWW_AUTHENTICATE,
};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use rmcp::ServiceExt;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tower::{Layer, service_fn};

use self::direct::Route;
use self::manager::Manager;
pub(crate) use self::sessions::SessionLimits;
use self::sessions::{Access, Full, Opening, Owner, Sessions};
use crate::error::Error;
use crate::http::Admitted;
use crate::http::error::{retry_after_header, status_of};
use crate::http::origin;
use crate::http::{Admission, GateLayer};
use crate::principal::Principal;
use crate::tool_error::ToolError;
use crate::wire::paths;
use crate::wire::{BEARER_CHALLENGE, JSON, NO_STORE, codes};

pub(crate) use handler::McpHandler;

/// JSON-RPC's "Invalid Request", the code of transport-level refusals (origin, credentials).
const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC's "Parse error": the body is not JSON.
const PARSE_ERROR: i32 = -32700;
/// The SDK's answer to a request naming a session it does not have, made JSON as the SDK's
/// refusals are ([`json_refusal`]).
const SESSION_NOT_FOUND: &str = "Not Found: Session not found";

/// How MCP is served; set through the [`App`](crate::App) builder.
#[derive(Debug, Clone, Default)]
pub(crate) struct McpOptions {
    /// The caller over stdio, where there is no request to authenticate.
    pub(crate) stdio_principal: Principal,
    /// How many sessions may be open, and how long one may be idle.
    pub(crate) sessions: SessionLimits,
}

/// `/mcp`, behind the gate, whose configuration snapshot gives the browser origins allowed
/// besides the loopback ones (the same list as carmy/1's CORS). `shutdown` ends every session
/// and stream (the end of a graceful shutdown: an open session stream would otherwise keep the
/// server up forever).
pub(crate) fn router(
    gate: &GateLayer,
    handler: McpHandler,
    keep_alive: Duration,
    limits: SessionLimits,
    shutdown: CancellationToken,
) -> Router {
    let sessions = Arc::new(Sessions::new(limits, shutdown.clone()));
    let config = StreamableHttpServerConfig::default()
        // The gate checks the Origin, which is what stops DNS rebinding; a Host allowlist
        // would refuse every deployment not on loopback.
        .disable_allowed_hosts()
        // Short calls are answered as plain JSON; a call that reports progress streams.
        .with_json_response(true)
        .with_sse_keep_alive(Some(keep_alive))
        .with_cancellation_token(shutdown);
    let max_body = config.max_request_body_bytes;
    let sdk_handler = handler.clone();
    let manager = Arc::new(Manager::new(limits, Arc::clone(&sessions)));
    let sdk = StreamableHttpService::new(
        move || Ok(sdk_handler.clone()),
        Arc::clone(&manager),
        config,
    );
    let endpoint = Arc::new(Endpoint {
        sdk,
        manager,
        sessions,
        handler,
        max_body,
    });
    // A plain function rather than `from_fn` middleware, which boxes the service it wraps and
    // clones it (and the SDK's `Service::call` clones it again) on every request.
    let admitted = service_fn(move |request| {
        let endpoint = Arc::clone(&endpoint);
        async move { Ok::<_, Infallible>(admit(request, &endpoint).await) }
    });
    // Refusals are JSON-RPC errors here, and MCP checks browser origins by its own rule.
    let gate = gate.for_transport(Admission {
        refuse: |error, _| refusal(&error),
        same_origin: false,
    });
    Router::new()
        .route_service(paths::MCP, gate.layer(admitted))
        .route(
            "/mcp/{*rest}",
            gate.endpoints(()).any(crate::http::route_not_found),
        )
}

/// What serves `/mcp`: the SDK, and the handler for the calls answered directly.
struct Endpoint {
    /// The SDK's Streamable HTTP service, serving [`McpHandler`].
    sdk: StreamableHttpService<McpHandler, Manager>,
    /// The SDK's sessions, asked whether one still lives before a call is answered in it.
    manager: Arc<Manager>,
    /// What carmy knows of those sessions.
    sessions: Arc<Sessions>,
    handler: McpHandler,
    /// The SDK's limit on a request body.
    max_body: usize,
}

/// Serves MCP on stdin and stdout until the client closes stdin. Logs belong on stderr.
pub(crate) async fn serve_stdio(handler: McpHandler) -> Result<(), Error> {
    let running = handler
        .serve(rmcp::transport::io::stdio())
        .await
        .map_err(|error| Error::Mcp(error.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|error| Error::Mcp(error.to_string()))?;
    Ok(())
}

/// Refuses foreign browser origins (`403`) and requests naming another caller's session (as
/// unknown, `404`), then answers a plain `tools/call` directly and hands any other request to
/// the SDK; the protection gate in front has already attached the caller and the
/// configuration snapshot.
async fn admit(request: Request, endpoint: &Endpoint) -> Response {
    let allowed: &[String] = request
        .extensions()
        .get::<Admitted>()
        .map_or(&[], |admitted| &admitted.settings.protection.cors_origins);
    if let Some(origin) = request.headers().get(ORIGIN)
        && !origin::loopback_or_allowed(origin, allowed)
    {
        return refusal(&origin::refused());
    }
    // The header as the SDK reads it: the first, as text.
    if let Some(id) = request
        .headers()
        .get(&direct::SESSION_ID)
        .and_then(|value| value.to_str().ok())
    {
        let owner = Owner::of(request.headers(), request.extensions());
        match endpoint.sessions.access(id, &owner) {
            Access::Owned => {}
            // Told apart from an unknown one by nothing, and nothing is done.
            Access::Foreign => return session_not_found().await,
            // The SDK would answer `202`, as if it had ended something.
            Access::Unknown if request.method() == Method::DELETE => {
                return session_not_found().await;
            }
            Access::Unknown => {}
        }
    }
    // Boxed: the futures are kilobytes, which the gate's future would carry and move.
    let request = match direct::route(&request, endpoint.max_body) {
        Route::Stateless => match Box::pin(direct::answer(request, &endpoint.handler)).await {
            Ok(answered) => return json_refusal(answered).await,
            Err(declined) => declined,
        },
        Route::Session => {
            let answering = direct::answer_in_session(
                request,
                &endpoint.handler,
                &endpoint.sessions,
                &endpoint.manager,
            );
            match Box::pin(answering).await {
                Ok(answered) => return json_refusal(answered).await,
                Err(declined) => declined,
            }
        }
        Route::Sdk => request,
    };
    json_refusal(Box::pin(hand_to_sdk(request, endpoint)).await).await
}

/// The SDK's answer to `request`, followed for what carmy keeps of sessions: the session an
/// `initialize` opens (within the caps), a request that reaches the session's worker. A POST's
/// body is read here, within the SDK's limit and the body deadline, so that a body that fails
/// is answered as carmy answers it elsewhere.
async fn hand_to_sdk(request: Request, endpoint: &Endpoint) -> Response {
    let (mut parts, body) = request.into_parts();
    let session_id = parts
        .headers
        .get(&direct::SESSION_ID)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let mut posted = None;
    let mut opening = None;
    // Who would own a session this request opens.
    let opener = (session_id.is_none() && parts.method == Method::POST)
        .then(|| Owner::of(&parts.headers, &parts.extensions));
    let body = if parts.method == Method::POST {
        let bytes = match read_body(body, endpoint.max_body).await {
            Ok(bytes) => bytes,
            Err(error) => return refusal(&error),
        };
        if let Some(owner) = &opener
            && let Some(id) = initialize_id(&bytes)
        {
            match endpoint.sessions.reserve(owner.clone()) {
                Ok(reserved) => {
                    let started = Opening::default();
                    parts.extensions.insert(started.clone());
                    opening = Some((started, reserved));
                }
                Err(full) => return refusal_of(&id, &session_limit(full)),
            }
        }
        posted = Some(bytes.clone());
        Body::from(bytes)
    } else {
        body
    };
    let json_body = direct::is_json(&parts.headers);
    let request = Request::from_parts(parts, body);
    let answered = endpoint.sdk.handle(request).await.map(Body::new);
    let status = answered.status();
    let opened = answered
        .headers()
        .get(&direct::SESSION_ID)
        .and_then(|value| value.to_str().ok());
    match (session_id, opened, opener) {
        // Accepted: it reached the session's worker.
        (Some(id), _, _) if status.is_success() => endpoint.sessions.handed_over(&id),
        (None, Some(id), Some(owner)) if status.is_success() => {
            let (started, reserved) = match opening {
                Some(opening) => opening,
                // An opening carmy did not recognize still gets its owner, past the caps.
                None => (Opening::default(), endpoint.sessions.adopt(owner)),
            };
            endpoint.sessions.opened(id, &started, reserved);
            // A session whose handshake failed may be closed already, before carmy knew it.
            let id: Arc<str> = Arc::from(id);
            if !endpoint.manager.has_session(&id).await.unwrap_or(false) {
                endpoint.sessions.ended(&id);
            }
        }
        _ => {}
    }
    match posted {
        Some(bytes) if status == StatusCode::UNSUPPORTED_MEDIA_TYPE && json_body => {
            unparsable(&bytes)
        }
        _ => answered,
    }
}

/// The whole body of a POST, at most `max` bytes (the SDK's limit), within the body deadline.
async fn read_body(body: Body, max: usize) -> Result<Bytes, ToolError> {
    let too_large = || {
        ToolError::validation(
            codes::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {max} bytes"),
        )
        .details(json!({ "limit_bytes": max }))
        .recoverable(true)
    };
    if body.size_hint().lower() > max as u64 {
        return Err(too_large());
    }
    match crate::http::whole_body(Limited::new(body, max)).await {
        Ok(bytes) => Ok(bytes),
        Err(error) if error.is::<LengthLimitError>() => Err(too_large()),
        Err(error) => Err(crate::http::unreadable_body(&*error)),
    }
}

/// The id of an `initialize` request, which opens a session; `None` for any other body.
fn initialize_id(body: &[u8]) -> Option<Value> {
    #[derive(Deserialize)]
    struct Envelope<'a> {
        #[serde(borrow)]
        method: Option<std::borrow::Cow<'a, str>>,
        #[serde(default)]
        id: Value,
    }
    let envelope: Envelope<'_> = serde_json::from_slice(body).ok()?;
    (envelope.method.as_deref() == Some("initialize")).then(|| match envelope.id {
        id @ (Value::String(_) | Value::Number(_)) => id,
        _ => Value::Null,
    })
}

/// The refusal of a session over a cap: `503`, retryable.
fn session_limit(full: Full) -> ToolError {
    let (message, scope, limit) = match full {
        Full::Caller(limit) => (
            format!(
                "this caller has {limit} MCP sessions open, the most it may: end one (DELETE \
                 /mcp) or let one expire"
            ),
            "caller",
            limit,
        ),
        Full::Server(limit) => (
            format!("the server has {limit} MCP sessions open, the most it keeps"),
            "server",
            limit,
        ),
    };
    ToolError::capacity(codes::MCP_SESSION_LIMIT, message)
        .retryable(None)
        .details(json!({ "scope": scope, "limit": limit }))
}

/// A body the SDK could not read as a JSON-RPC message (its `415`): `400`, a parse error if it
/// is not JSON at all, else an invalid request.
fn unparsable(body: &[u8]) -> Response {
    let (code, message) = match serde_json::from_slice::<serde::de::IgnoredAny>(body) {
        Err(error) => (PARSE_ERROR, format!("Parse error: {error}")),
        Ok(_) => (
            INVALID_REQUEST,
            "Invalid Request: the body is not a JSON-RPC request, notification or response"
                .to_owned(),
        ),
    };
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": code, "message": message },
    });
    (
        StatusCode::BAD_REQUEST,
        [(CONTENT_TYPE, JSON.clone())],
        body.to_string(),
    )
        .into_response()
}

/// The answer to a request naming a session the caller may not use: the SDK's to an unknown
/// one, byte for byte.
async fn session_not_found() -> Response {
    json_refusal((StatusCode::NOT_FOUND, SESSION_NOT_FOUND).into_response()).await
}

/// The SDK refuses some requests (wrong method, `Accept` or `Content-Type`) in plain text:
/// the same refusal, as a JSON-RPC error without an id.
async fn json_refusal(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"));
    if is_json || !(response.status().is_client_error() || response.status().is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = body
        .collect()
        .await
        .map(|body| body.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let message = match text.trim() {
        "" => parts.status.canonical_reason().unwrap_or("refused"),
        text => text,
    };
    let body = json!({
        "jsonrpc": "2.0",
        "id": null,
        "error": { "code": INVALID_REQUEST, "message": message },
    });
    parts.headers.insert(CONTENT_TYPE, JSON.clone());
    parts.headers.remove(CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body.to_string()))
}

/// A transport-level refusal: the HTTP status of the carmy error, and a JSON-RPC error without
/// an id whose `data` is the carmy error.
pub(crate) fn refusal(error: &ToolError) -> Response {
    refusal_of(&Value::Null, error)
}

/// A transport-level refusal of the request `id`.
fn refusal_of(id: &Value, error: &ToolError) -> Response {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": INVALID_REQUEST, "message": error.message(), "data": error },
    });
    let mut response = (status_of(error), body.to_string()).into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, JSON.clone());
    headers.insert(CACHE_CONTROL, NO_STORE.clone());
    if error.code() == codes::UNAUTHENTICATED {
        headers.insert(WWW_AUTHENTICATE, BEARER_CHALLENGE.clone());
    }
    if let Some(retry_after) = retry_after_header(error) {
        headers.insert(RETRY_AFTER, retry_after);
    }
    response
}
