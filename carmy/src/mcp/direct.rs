//! The stateless (2026-07-28) `tools/call` answered without the SDK's per-request machinery:
//! its message enum, parsed through buffered untagged variants and serialized again to check
//! the headers, a one-shot transport and a service spawned for each request.
//!
//! Only a request that the SDK would hand to `call_tool` unchanged is taken here, judged with
//! the SDK's own types where they decide (the id, `_meta`'s required keys); its answer is the
//! SDK's message type, serialized as the SDK does. Anything else (a refusal, a session, a
//! progress token, a client that takes tasks, a header out of the ordinary) is declined, and
//! the SDK answers it as before.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{ACCEPT, CONTENT_TYPE, HOST};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderName, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use http_body_util::BodyExt;
use rmcp::model::{
    CallToolRequestMethod, ConstString, JsonRpcVersion2_0, ProtocolVersion, RequestId,
    RequestMetaObject, ServerJsonRpcMessage, ServerResult,
};
use rmcp::transport::common::http_header::{
    BASE64_HEADER_PREFIX, BASE64_HEADER_SUFFIX, EVENT_STREAM_MIME_TYPE, JSON_MIME_TYPE,
};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::McpHandler;
use crate::wire::JSON;

/// The SDK's headers (`rmcp::transport::common::http_header`), as header names.
static PROTOCOL_VERSION: HeaderName = HeaderName::from_static("mcp-protocol-version");
static METHOD: HeaderName = HeaderName::from_static("mcp-method");
static NAME: HeaderName = HeaderName::from_static("mcp-name");
static SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
/// The prefix of the `Mcp-Param-*` headers, lower case as header names are.
const PARAM_PREFIX: &str = "mcp-param-";

/// Whether `request` may be answered here, by what is known before reading its body: its
/// headers, and a body of known length within `max_body`, the SDK's limit (a chunked one may
/// be too large, which the SDK refuses). Checked before anything is allocated for the direct
/// path, so that what goes to the SDK pays next to nothing for it.
pub(super) fn may_answer(request: &Request, max_body: usize) -> bool {
    request
        .body()
        .size_hint()
        .upper()
        .is_some_and(|length| length <= max_body as u64)
        && headers_qualify(request.method(), request.headers())
}

/// Answers `request`, which [`may_answer`], if its body is a stateless `tools/call` the SDK
/// would dispatch unchanged; otherwise gives it back, body included, for the SDK.
pub(super) async fn answer(request: Request, handler: &McpHandler) -> Result<Response, Request> {
    let (parts, body) = request.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        // The SDK's answer to a body that fails (in plain text, made JSON by the caller).
        Err(error) => {
            let message = format!("Failed to read request body: {error}");
            return Ok((StatusCode::INTERNAL_SERVER_ERROR, message).into_response());
        }
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
        )
        .await;
    // The SDK's own answer: its message, 200 for a result and for the errors `call_tool`
    // gives (invalid params with well-formed `_meta`, internal), as JSON.
    let message = match answered {
        Ok(result) => ServerJsonRpcMessage::response(ServerResult::from(result), id),
        Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
    };
    Ok(match serde_json::to_vec(&message) {
        Ok(body) => {
            let mut response = Response::new(Body::from(body));
            response.headers_mut().insert(CONTENT_TYPE, JSON.clone());
            response
        }
        Err(error) => {
            let message = format!("Encounter an error when serialize json response: {error}");
            (StatusCode::INTERNAL_SERVER_ERROR, message).into_response()
        }
    })
}

/// A `tools/call` JSON-RPC request with nothing but what `call_tool` reads: any other member
/// declines it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsCall {
    /// Checked by deserializing: "2.0".
    #[serde(rename = "jsonrpc")]
    _jsonrpc: JsonRpcVersion2_0,
    id: RequestId,
    /// Checked by deserializing: "tools/call".
    #[serde(rename = "method")]
    _method: CallToolRequestMethod,
    params: ToolsCallParams,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolsCallParams {
    #[serde(rename = "_meta")]
    meta: RequestMetaObject,
    name: String,
    #[serde(default)]
    arguments: Option<Map<String, Value>>,
}

/// Whether the headers are those of a stateless 2026-07-28 `tools/call` that the SDK accepts
/// as they are: a POST of JSON, accepting JSON and events (plain media types, no parameters),
/// from a valid `Host`, naming the version and the method once each, with no session and no
/// `Mcp-Param-*` header.
fn headers_qualify(method: &Method, headers: &HeaderMap) -> bool {
    *method == Method::POST
        && single(headers, &PROTOCOL_VERSION) == Some(ProtocolVersion::V_2026_07_28.as_str())
        && single(headers, &METHOD) == Some(CallToolRequestMethod::VALUE)
        && !headers.contains_key(&SESSION_ID)
        && headers
            .get(HOST)
            .and_then(|host| host.to_str().ok())
            .is_some_and(|host| Authority::try_from(host).is_ok())
        && headers
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| {
                let essence = value.split_once(';').map_or(value, |(essence, _)| essence);
                essence.trim().eq_ignore_ascii_case(JSON_MIME_TYPE)
            })
        && accepts_json_and_events(headers)
        && !headers
            .keys()
            .any(|name| name.as_str().starts_with(PARAM_PREFIX))
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
fn qualifying_call(headers: &HeaderMap, body: &[u8]) -> Option<(RequestId, ToolsCallParams)> {
    let ToolsCall { id, params, .. } = serde_json::from_slice(body).ok()?;
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
        headers_qualify(&Method::POST, headers) && qualifying_call(headers, &body(params)).is_some()
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
        assert!(!headers_qualify(&Method::GET, &headers()));
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
