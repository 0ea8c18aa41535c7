//! The plain `tools/call`, the bulk of MCP traffic, answered without the SDK's per-request
//! machinery:
//! - stateless (2026-07-28): its message enum, parsed through buffered untagged variants and
//!   serialized again to check the headers, a one-shot transport and a service spawned for
//!   each request;
//! - in a session (`initialize`/`Mcp-Session-Id`): the session's worker task, a channel and an
//!   event stream per request, and an answer framed as a server-sent event. Such a call is
//!   answered as JSON, which the protocol lets a server choose; it runs in a task of its own,
//!   as the SDK runs it, so a client that goes away does not cancel it, while
//!   `notifications/cancelled` and the end of the session do ([`Sessions`]).
//!
//! Only a request that the SDK would hand to `call_tool` unchanged is taken here, judged with
//! the SDK's own types where they decide (the id, `_meta`'s required keys); its answer is the
//! SDK's message type, serialized as the SDK does. Anything else (a refusal, a progress token,
//! a client that takes tasks, a header out of the ordinary, a session carmy did not see open)
//! is declined, and the SDK answers it as before.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HOST};
use axum::http::request::Parts;
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use rmcp::ErrorData;
use rmcp::model::{
    CallToolRequestMethod, CancelledNotificationMethod, ConstString, JsonRpcVersion2_0,
    ProtocolVersion, RequestId, RequestMetaObject, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::common::http_header::{
    BASE64_HEADER_PREFIX, BASE64_HEADER_SUFFIX, EVENT_STREAM_MIME_TYPE, JSON_MIME_TYPE,
};
use rmcp::transport::streamable_http_server::session::SessionManager;
use serde::Deserialize;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

use super::McpHandler;
use super::manager::Manager;
use super::sessions::Sessions;
use crate::wire::JSON;

/// The SDK's headers (`rmcp::transport::common::http_header`), as header names.
static PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
static METHOD: HeaderName = HeaderName::from_static("mcp-method");
static NAME: HeaderName = HeaderName::from_static("mcp-name");
pub(super) static SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// The prefix of the `Mcp-Param-*` headers, lower case as header names are.
const PARAM_PREFIX: &str = "mcp-param-";

/// The `initialize` generations whose sessions are served: those with structured tool output.
/// Before 2026-07-28, the SDK checks no `Mcp-Method`, `Mcp-Name` or `Mcp-Param-*` header.
const SESSION_VERSIONS: [&ProtocolVersion; 2] = [
    &ProtocolVersion::V_2025_06_18,
    &ProtocolVersion::V_2025_11_25,
];

/// Which direct answer a request may get, by what is known before reading its body.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// A stateless `tools/call`: [`answer`].
    Stateless,
    /// A request of a session: [`answer_in_session`].
    Session,
    /// Straight to the SDK.
    Sdk,
}

/// Where `request` goes, by its headers and a body of known length within `max_body`, the
/// SDK's limit (a chunked one may be too large, which the SDK refuses). Decided before anything
/// is allocated for the direct path, so that what goes to the SDK pays next to nothing for it.
pub(super) fn route(request: &Request, max_body: usize) -> Route {
    let headers = request.headers();
    let plain = request
        .body()
        .size_hint()
        .upper()
        .is_some_and(|length| length <= max_body as u64)
        && plain_post(request.method(), headers);
    if !plain {
        Route::Sdk
    } else if stateless_headers(headers) {
        Route::Stateless
    } else if session_headers(headers) {
        Route::Session
    } else {
        Route::Sdk
    }
}

/// Answers `request`, routed [`Route::Stateless`], if its body is a stateless `tools/call` the
/// SDK would dispatch unchanged; otherwise gives it back, body included, for the SDK.
pub(super) async fn answer(request: Request, handler: &McpHandler) -> Result<Response, Request> {
    let (parts, bytes) = match read(request).await {
        Ok(read) => read,
        Err(failed) => return Ok(failed),
    };
    let Some((id, params)) = qualifying_call(&parts.headers, &bytes) else {
        return Err(Request::from_parts(parts, Body::from(bytes)));
    };
    let answered = handler
        .call_directly(
            params.name,
            params.arguments.unwrap_or_default(),
            &params.meta,
            &parts.extensions,
            CancellationToken::new(),
        )
        .await;
    Ok(json_rpc_answer(id, answered.map(ServerResult::from)))
}

/// Answers `request`, routed [`Route::Session`], if its body is a plain `tools/call` of a live
/// session that carmy saw open; notes the calls that `notifications/cancelled` cancels; gives
/// anything else back, body included, for the SDK.
pub(super) async fn answer_in_session(
    request: Request,
    handler: &McpHandler,
    sessions: &Arc<Sessions>,
    manager: &Manager,
) -> Result<Response, Request> {
    let (parts, bytes) = match read(request).await {
        Ok(read) => read,
        Err(failed) => return Ok(failed),
    };
    // Routed here with exactly one, readable.
    let session_id = single(&parts.headers, &SESSION_ID).unwrap_or_default();
    let Some((id, params)) = qualifying_session_call(&bytes) else {
        if let Some(request_id) = cancelled_call(&bytes) {
            sessions.cancel_call(session_id, &request_id);
        }
        return Err(Request::from_parts(parts, Body::from(bytes)));
    };
    // The SDK ends sessions on its own (a DELETE, its keep-alive, the shutdown): it answers
    // for one it no longer has.
    if !manager
        .has_session(&Arc::from(session_id))
        .await
        .unwrap_or(false)
    {
        sessions.ended(session_id);
        return Err(Request::from_parts(parts, Body::from(bytes)));
    }
    let Some(running) = sessions.begin_call(session_id, &id) else {
        return Err(Request::from_parts(parts, Body::from(bytes)));
    };
    let extensions = parts.extensions;
    let caller = handler.clone();
    // A task of the runtime's: the call goes on when its client leaves, and a graceful
    // shutdown waits for it.
    let call = handler.spawn(async move {
        let cancel = running.cancel_token();
        let answered = caller
            .call_directly(
                params.name,
                params.arguments.unwrap_or_default(),
                &params.meta,
                &extensions,
                cancel,
            )
            .await;
        drop(running);
        answered
    });
    let answered = call
        .await
        .unwrap_or_else(|_| Err(ErrorData::internal_error("the call's task failed", None)));
    // A session negotiated a version before 2026-07-28: the result has the shape the SDK gives
    // it for such a peer, without `resultType: "complete"` and with structured content only
    // as an object.
    let answered = answered.map(|result| {
        let mut result = ServerResult::from(result);
        result.strip_result_type_for_legacy_peer();
        result.strip_non_object_output_for_legacy_peer();
        result
    });
    Ok(json_rpc_answer(id, answered))
}

/// The request's head and whole body (of a length known to be within the SDK's limit), or the
/// refusal of a body that fails: `408` past the body deadline, else `400`.
async fn read(request: Request) -> Result<(Parts, Bytes), Response> {
    let (parts, body) = request.into_parts();
    match crate::http::whole_body(body).await {
        Ok(bytes) => Ok((parts, bytes)),
        Err(error) => Err(super::refusal(&crate::http::unreadable_body(&error))),
    }
}

/// The SDK's own answer to a call: its message, 200 for a result and for the errors
/// `call_tool` gives (invalid params with well-formed `_meta`, internal), as JSON.
fn json_rpc_answer(id: RequestId, answered: Result<ServerResult, ErrorData>) -> Response {
    let message = match answered {
        Ok(result) => ServerJsonRpcMessage::response(result, id),
        Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
    };
    match serde_json::to_vec(&message) {
        Ok(body) => {
            let length = crate::http::content_length(body.len());
            let mut response = Response::new(Body::from(body));
            let headers = response.headers_mut();
            headers.insert(CONTENT_TYPE, JSON.clone());
            // Set here from the lengths made once; axum would format and allocate it.
            headers.insert(CONTENT_LENGTH, length);
            response
        }
        Err(error) => {
            let message = format!("Encounter an error when serialize json response: {error}");
            (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
        }
    }
}

/// A `tools/call` JSON-RPC request with nothing but what `call_tool` reads: any other member
/// declines it. `Meta`: the stateless `_meta`, or a session's plain map.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, bound = "Meta: Deserialize<'de> + Default")]
struct ToolsCall<Meta> {
    /// Checked by deserializing: "2.0".
    #[serde(rename = "jsonrpc")]
    _jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    /// Checked by deserializing: "tools/call".
    #[serde(rename = "method")]
    _method: CallToolRequestMethod,
    params: ToolsCallParams<Meta>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, bound = "Meta: Deserialize<'de> + Default")]
struct ToolsCallParams<Meta> {
    #[serde(rename = "_meta", default)]
    meta: Meta,
    name: String,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
}

/// A POST of JSON that the SDK reads as it is: accepting JSON and events (plain media types,
/// no parameters), from a valid `Host`.
fn plain_post(method: &Method, headers: &HeaderMap) -> bool {
    *method == Method::POST
        && headers
            .get(HOST)
            .and_then(|host| host.to_str().ok())
            .is_some_and(|host| Authority::try_from(host).is_ok())
        && is_json(headers)
        && accepts_json_and_events(headers)
}

/// The body is JSON by its `Content-Type`, as the SDK judges it.
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
            essence.trim().eq_ignore_ascii_case(JSON_MIME_TYPE)
        })
}

/// A stateless 2026-07-28 `tools/call`: naming the version and the method once each, with no
/// session and no `Mcp-Param-*` header.
fn stateless_headers(headers: &HeaderMap) -> bool {
    single(headers, &PROTOCOL_VERSION) == Some(ProtocolVersion::V_2026_07_28.as_str())
        && single(headers, &METHOD) == Some(CallToolRequestMethod::VALUE)
        && !headers.contains_key(&SESSION_ID)
        && !headers
            .keys()
            .any(|name| name.as_str().starts_with(PARAM_PREFIX))
}

/// A request of a session, naming it and a served `initialize` generation once each.
fn session_headers(headers: &HeaderMap) -> bool {
    single(headers, &SESSION_ID).is_some()
        && single(headers, &PROTOCOL_VERSION)
            .is_some_and(|version| SESSION_VERSIONS.iter().any(|v| v.as_str() == version))
}

/// `Accept` lists both JSON and event streams, as plain media types: a parameter (a weight)
/// or a quote leaves the reading to the SDK.
fn accepts_json_and_events(headers: &HeaderMap) -> bool {
    let (mut json, mut events) = (false, false);
    for value in headers.get_all(ACCEPT) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for media_type in value.split(',') {
            if media_type.contains([';', '"']) {
                return false;
            }
            let media_type = media_type.trim();
            json |= media_type.eq_ignore_ascii_case(JSON_MIME_TYPE);
            events |= media_type.eq_ignore_ascii_case(EVENT_STREAM_MIME_TYPE);
        }
    }
    json && events
}

/// The call's id and parameters, if the body is a `tools/call` that the SDK hands to
/// `call_tool` unchanged: the 2026-07-28 `_meta` (version and client capabilities, which the
/// SDK requires), no progress token and no tasks extension (which need the SDK), and an
/// `Mcp-Name` that is the tool's name as written.
fn qualifying_call(
    headers: &HeaderMap,
    body: &[u8],
) -> Option<(RequestId, ToolsCallParams<RequestMetaObject>)> {
    let ToolsCall::<RequestMetaObject> { id, params, .. } = serde_json::from_slice(body).ok()?;
    let meta = &params.meta;
    let modern = meta.protocol_version() == Some(ProtocolVersion::V_2026_07_28)
        && meta
            .client_capabilities()
            .is_some_and(|capabilities| !capabilities.supports_tasks())
        && !meta.contains_key("progressToken");
    let name = &params.name;
    let named = single(headers, &NAME) == Some(name.as_str())
        && !(name.starts_with(BASE64_HEADER_PREFIX) && name.ends_with(BASE64_HEADER_SUFFIX));
    (modern && named).then_some((id, params))
}

/// The call's id and parameters, if the body is a `tools/call` of a session that the SDK hands
/// to `call_tool` unchanged: no progress token, and no key of MCP's own in `_meta` (a version
/// of its own, the tasks extension), which need the SDK.
fn qualifying_session_call(
    body: &[u8],
) -> Option<(RequestId, ToolsCallParams<Map<String, Value>>)> {
    let ToolsCall::<Map<String, Value>> { id, params, .. } = serde_json::from_slice(body).ok()?;
    let plain = params
        .meta
        .keys()
        .all(|key| key != "progressToken" && !key.starts_with("io.modelcontextprotocol/"));
    plain.then_some((id, params))
}

/// `notifications/cancelled`: the id of the call it cancels.
fn cancelled_call(body: &[u8]) -> Option<RequestId> {
    #[derive(Deserialize)]
    struct Cancelled {
        #[serde(rename = "method")]
        _method: CancelledNotificationMethod,
        params: Params,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        request_id: RequestId,
    }
    let cancelled: Cancelled = serde_json::from_slice(body).ok()?;
    Some(cancelled.params.request_id)
}

/// The value of a header given exactly once, as text.
fn single<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values.next().is_none().then(|| value.to_str().ok())?
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body(params: &Value) -> Vec<u8> {
        json!({ "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params })
            .to_string()
            .into_bytes()
    }

    fn params() -> Value {
        json!({
            "name": "echo",
            "arguments": { "text": "a" },
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            },
        })
    }

    fn headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("host", "localhost:3000"),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2026-07-28"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "echo"),
        ] {
            headers.append(name, value.parse().unwrap());
        }
        headers
    }

    fn qualifies(headers: &HeaderMap, params: &Value) -> bool {
        plain_post(&Method::POST, headers)
            && stateless_headers(headers)
            && qualifying_call(headers, &body(params)).is_some()
    }

    #[test]
    fn a_plain_stateless_call_qualifies() {
        assert!(qualifies(&headers(), &params()));
        let mut charset = headers();
        charset.insert(
            CONTENT_TYPE,
            "Application/JSON; charset=utf-8".parse().unwrap(),
        );
        assert!(qualifies(&charset, &params()));
        let mut split = headers();
        split.insert(ACCEPT, "text/event-stream".parse().unwrap());
        split.append(ACCEPT, "application/json".parse().unwrap());
        assert!(qualifies(&split, &params()));
        let (id, call) = qualifying_call(&headers(), &body(&params())).unwrap();
        assert_eq!((id, call.name.as_str()), (RequestId::Number(7), "echo"));
    }

    fn routed(method: Method, headers: &[(&str, &str)]) -> Route {
        let mut request = Request::builder().method(method).uri("/mcp");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        route(&request.body(Body::from("{}")).unwrap(), 1024)
    }

    #[test]
    fn requests_are_routed_by_their_headers() {
        let plain = [
            ("host", "localhost:3000"),
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut headers = plain.to_vec();
            headers.extend_from_slice(extra);
            headers
        };
        let session = |version| with(&[("mcp-session-id", "s"), ("mcp-protocol-version", version)]);
        assert_eq!(routed(Method::POST, &session("2025-11-25")), Route::Session);
        assert_eq!(routed(Method::POST, &session("2025-06-18")), Route::Session);
        let modern = headers();
        let stateless: Vec<(&str, &str)> = modern
            .iter()
            .map(|(name, value)| (name.as_str(), value.to_str().unwrap()))
            .collect();
        assert_eq!(routed(Method::POST, &stateless), Route::Stateless);
        let to_the_sdk = [
            session("2025-03-26"),
            session("2026-07-28"),
            with(&[("mcp-session-id", "s")]),
            with(&[
                ("mcp-session-id", "s"),
                ("mcp-session-id", "t"),
                ("mcp-protocol-version", "2025-11-25"),
            ]),
            with(&[("mcp-protocol-version", "2025-11-25")]),
            session("2025-11-25")[1..].to_vec(),
            plain.to_vec(),
        ];
        for headers in to_the_sdk {
            assert_eq!(routed(Method::POST, &headers), Route::Sdk, "{headers:?}");
        }
        assert_eq!(routed(Method::DELETE, &session("2025-11-25")), Route::Sdk);
        let large = Request::post("/mcp")
            .body(Body::from(vec![b' '; 1025]))
            .unwrap();
        assert_eq!(route(&large, 1024), Route::Sdk);
    }

    #[test]
    fn only_a_plain_call_of_a_session_is_answered_in_it() {
        let call = |params: Value| {
            qualifying_session_call(
                json!({ "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params })
                    .to_string()
                    .as_bytes(),
            )
        };
        let (id, params) = call(json!({ "name": "echo", "arguments": { "text": "a" } })).unwrap();
        assert_eq!((id, params.name.as_str()), (RequestId::Number(3), "echo"));
        assert!(call(json!({ "name": "echo" })).is_some());
        let key = json!({ "name": "echo", "_meta": { "dev.carmy/request_id": "k" } });
        assert!(call(key).is_some());
        let declined = [
            json!({ "name": "echo", "_meta": { "progressToken": 1 } }),
            json!({ "name": "echo", "_meta": { "io.modelcontextprotocol/protocolVersion": "2025-11-25" } }),
            json!({ "name": "echo", "_meta": null }),
            json!({ "name": "echo", "task": { "ttl": 1000 } }),
            json!({ "name": "echo", "arguments": [1] }),
            json!({ "arguments": {} }),
        ];
        for params in declined {
            assert!(call(params.clone()).is_none(), "{params}");
        }

        let cancelled = |body: Value| cancelled_call(body.to_string().as_bytes());
        let named = json!({
            "jsonrpc": "2.0", "method": "notifications/cancelled",
            "params": { "requestId": "call-1", "reason": "changed my mind" }
        });
        assert_eq!(cancelled(named), Some(RequestId::String("call-1".into())));
        let unnamed =
            json!({ "jsonrpc": "2.0", "method": "notifications/cancelled", "params": {} });
        assert_eq!(cancelled(unnamed), None);
        let other = json!({
            "jsonrpc": "2.0", "method": "notifications/initialized", "params": { "requestId": 1 }
        });
        assert_eq!(cancelled(other), None);
    }

    #[test]
    fn unusual_headers_are_left_to_the_sdk() {
        let changed = |name: &'static str, value: Option<&'static str>| {
            let mut headers = headers();
            match value {
                Some(value) => headers.insert(name, value.parse().unwrap()),
                None => headers.remove(name),
            };
            headers
        };
        let declined = [
            changed("accept", Some("application/json, text/event-stream;q=0")),
            changed("accept", Some("application/json")),
            changed("accept", Some("*/*")),
            changed("content-type", Some("text/plain")),
            changed("content-type", None),
            changed("host", None),
            changed("host", Some("not a host")),
            changed("mcp-protocol-version", Some("2025-11-25")),
            changed("mcp-protocol-version", None),
            changed("mcp-method", Some("tools/list")),
            changed("mcp-method", None),
            changed("mcp-name", Some("other")),
            changed("mcp-name", None),
            changed("mcp-session-id", Some("abc")),
            changed("mcp-param-text", Some("a")),
        ];
        for headers in declined {
            assert!(!qualifies(&headers, &params()), "{headers:?}");
        }
        let mut twice = headers();
        twice.append("mcp-method", "tools/call".parse().unwrap());
        assert!(!qualifies(&twice, &params()));
        assert!(!plain_post(&Method::GET, &headers()));
    }

    #[test]
    fn bodies_beyond_a_plain_call_are_left_to_the_sdk() {
        let with = |pointer: &str, value: Value| {
            let mut params = params();
            *params.pointer_mut(pointer).unwrap() = value;
            params
        };
        let meta = "/_meta";
        let declined = [
            with(meta, json!({})),
            with(
                meta,
                json!({ "io.modelcontextprotocol/protocolVersion": "2026-07-28" }),
            ),
            with(
                meta,
                json!({
                    "io.modelcontextprotocol/protocolVersion": "2025-11-25",
                    "io.modelcontextprotocol/clientCapabilities": {},
                }),
            ),
            with(
                meta,
                json!({
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "progressToken": 1,
                }),
            ),
            with(
                meta,
                json!({
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientCapabilities": {
                        "extensions": { "io.modelcontextprotocol/tasks": {} }
                    },
                }),
            ),
            with("/arguments", json!([1])),
            with("/name", json!(5)),
        ];
        for params in declined {
            assert!(!qualifies(&headers(), &params), "{params}");
        }
        let mut extra = params();
        extra["requestState"] = json!("s");
        assert!(!qualifies(&headers(), &extra));
        let mut unnamed = params();
        unnamed.as_object_mut().unwrap().remove("name");
        assert!(!qualifies(&headers(), &unnamed));

        let envelope = |body: Value| qualifying_call(&headers(), body.to_string().as_bytes());
        let mut other =
            json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params() });
        assert!(envelope(other.clone()).is_some());
        other["jsonrpc"] = json!("1.0");
        assert!(envelope(other.clone()).is_none());
        other["jsonrpc"] = json!("2.0");
        other["id"] = json!(1.5);
        assert!(envelope(other.clone()).is_none());
        other["id"] = json!("one");
        other["extra"] = json!(true);
        assert!(envelope(other.clone()).is_none());
        assert!(qualifying_call(&headers(), b"{\"jsonrpc\":").is_none());

        let wrapped = "=?base64?ZWNobw==?=";
        let mut named = headers();
        named.insert("mcp-name", wrapped.parse().unwrap());
        assert!(!qualifies(&named, &with("/name", json!(wrapped))));
    }
}
