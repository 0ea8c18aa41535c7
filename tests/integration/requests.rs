//! Requests (issue 10): duplicated headers are refused, CORS covers `/mcp` with one origin list,
//! an unknown tool gets "did you mean", and `enum`/`oneOf` failures name the allowed values.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::auth::{TokenAuthenticator, hash_token};
use carmy::{JsonSchema, Principal, ToolError, TrustLevel};
use carmy_tests::{Answer, execute, execute_request, send};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::tools::{self, Probe, Text};

/// Returns its input, to internal callers only.
#[carmy::tool(effect = "none", access = "internal", register = false)]
async fn echo_internal(input: Text) -> Result<Text, ToolError> {
    Ok(input)
}

/// A colour.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Colour {
    /// Like a tomato.
    Red,
    /// Like grass.
    Green,
}

/// How to pay.
#[derive(Debug, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum Payment {
    /// By card.
    Card { number: String },
    /// In cash.
    Cash,
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
struct Paint {
    colour: Colour,
    payment: Payment,
}

/// Paints.
#[carmy::tool(effect = "none", register = false)]
async fn paint(input: Paint) -> Result<Paint, ToolError> {
    Ok(input)
}

fn app(probe: &Probe) -> carmy::App {
    tools::app(probe)
        .tool(echo_internal::TOOL)
        .tool(paint::TOOL)
}

fn error_of(answer: &Answer, status: StatusCode) -> Value {
    assert_eq!(
        answer.status,
        status,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()["error"].clone()
}

#[tokio::test]
async fn several_different_idempotency_keys_are_refused() {
    let router = app(&Probe::default()).router().unwrap();
    let call = json!({ "tool": "echo", "arguments": { "text": "a" } });
    let keys = [("idempotency-key", "k-1"), ("idempotency-key", "k-2")];
    let answer = send(&router, execute_request(&call, &keys)).await;
    let error = error_of(&answer, StatusCode::BAD_REQUEST);
    assert_eq!(error["code"], "INVALID_REQUEST");

    // A matching request_id does not pick one of them.
    let with_id = json!({ "tool": "echo", "arguments": { "text": "a" }, "request_id": "k-1" });
    let answer = send(&router, execute_request(&with_id, &keys)).await;
    assert_eq!(
        error_of(&answer, StatusCode::BAD_REQUEST)["code"],
        "INVALID_REQUEST"
    );

    // The same key twice is one key.
    let same = [("idempotency-key", "k-3"), ("idempotency-key", "k-3")];
    let answer = send(&router, execute_request(&call, &same)).await;
    assert_eq!(answer.status, StatusCode::OK);
}

/// A request with several faults is refused for the first, in one order: the content type,
/// the body, the `Idempotency-Key` headers, then `Carmy-Channel`. The headers are read before
/// the body; their faults still wait for the body's.
#[tokio::test]
async fn a_request_with_several_faults_is_refused_for_the_first() {
    let router = app(&Probe::default()).router().unwrap();
    let keys = [("idempotency-key", "k-1"), ("idempotency-key", "k-2")];
    let channel = ("carmy-channel", "robot");
    let request = |body: &str, content_type: &str, headers: &[(&str, &str)]| {
        let mut request = Request::post("/agent/execute").header("content-type", content_type);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(Body::from(body.to_owned())).unwrap()
    };
    let reason = |answer: &Answer| {
        let error = error_of(answer, StatusCode::BAD_REQUEST);
        assert_eq!(error["code"], "INVALID_REQUEST");
        error["details"]["reason"].as_str().unwrap().to_owned()
    };
    let every_fault = [keys[0], keys[1], channel];
    let valid = r#"{"tool":"echo","arguments":{"text":"a"}}"#;

    let answer = send(&router, request("{", "text/plain", &every_fault)).await;
    assert_eq!(reason(&answer), "the content type must be application/json");
    let answer = send(&router, request("{", "application/json", &every_fault)).await;
    assert!(reason(&answer).starts_with("invalid request body: "));
    let answer = send(&router, request(valid, "application/json", &every_fault)).await;
    assert_eq!(
        reason(&answer),
        "the request has several different Idempotency-Key headers"
    );
    let answer = send(&router, request(valid, "application/json", &[channel])).await;
    assert_eq!(
        reason(&answer),
        "Carmy-Channel must be `human` or `agent`, once"
    );
    let answer = send(&router, request(valid, "application/json", &[keys[0]])).await;
    assert_eq!(answer.status, StatusCode::OK);
}

#[tokio::test]
async fn several_origins_are_refused() {
    let router = app(&Probe::default())
        .cors_allowed_origin("https://app.example.com")
        .router()
        .unwrap();
    let origins = [
        ("origin", "https://app.example.com"),
        ("origin", "https://evil.example"),
    ];
    let call = json!({ "tool": "echo", "arguments": { "text": "a" } });
    let answer = send(&router, execute_request(&call, &origins)).await;
    assert_eq!(
        error_of(&answer, StatusCode::BAD_REQUEST)["code"],
        "INVALID_REQUEST"
    );

    let mut list = Request::post("/mcp")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list");
    for (name, value) in origins {
        list = list.header(name, value);
    }
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": { "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    } } });
    let answer = send(&router, list.body(Body::from(body.to_string())).unwrap()).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.json()["error"]["data"]["code"], "INVALID_REQUEST");

    // A preflight with two origins is granted nothing.
    let mut preflight =
        Request::options("/agent/execute").header("access-control-request-method", "POST");
    for (name, value) in origins {
        preflight = preflight.header(name, value);
    }
    let answer = send(&router, preflight.body(Body::empty()).unwrap()).await;
    assert_eq!(answer.header("access-control-allow-origin"), None);
}

const KNOWN_TOKEN: &str = "known-token";
const INTERNAL_TOKEN: &str = "internal-token";

/// The test tools behind the configuration's tokens (the gate's own check) or the builder's
/// authenticator (a host's), each knowing a `known` and an `internal` caller.
fn token_routers() -> Vec<axum::Router> {
    let config = carmy::Config::parse(
        &format!(
            "[[tokens]]\nid = \"agent\"\ntrust = \"known\"\nhash = \"{}\"\n\n\
             [[tokens]]\nid = \"ops\"\ntrust = \"internal\"\nhash = \"{}\"\n",
            hash_token(KNOWN_TOKEN),
            hash_token(INTERNAL_TOKEN)
        ),
        |_| None,
    )
    .unwrap();
    let authenticator = TokenAuthenticator::new()
        .token(
            &hash_token(KNOWN_TOKEN),
            Principal::new("agent", TrustLevel::Known),
        )
        .unwrap()
        .token(
            &hash_token(INTERNAL_TOKEN),
            Principal::new("ops", TrustLevel::Internal),
        )
        .unwrap();
    vec![
        app(&Probe::default()).config(config).router().unwrap(),
        app(&Probe::default())
            .authenticator(authenticator)
            .router()
            .unwrap(),
    ]
}

/// A stateless MCP `tools/call` of `echo_internal`, with `headers`.
fn mcp_call(headers: &[(&str, &str)]) -> Request<Body> {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "echo_internal",
        "arguments": { "text": "a" },
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    } });
    let mut request = Request::post("/mcp")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "echo_internal");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::from(body.to_string())).unwrap()
}

/// Two `Authorization` headers, or two `Carmy-Version`s, are refused whichever comes first
/// (over carmy/1 and, in JSON-RPC's shape, over MCP) before the caller is decided: the first
/// one never wins. One of each is served as before.
#[tokio::test]
async fn several_authorizations_or_versions_are_refused_in_either_order() {
    let known = format!("Bearer {KNOWN_TOKEN}");
    let internal = format!("Bearer {INTERNAL_TOKEN}");
    let call = json!({ "tool": "echo_internal", "arguments": { "text": "a" } });
    for router in token_routers() {
        // Alone, each token is its caller: the internal tool is hidden from the known one.
        let answer = send(
            &router,
            execute_request(&call, &[("authorization", &known)]),
        )
        .await;
        assert_eq!(
            error_of(&answer, StatusCode::NOT_FOUND)["code"],
            "TOOL_NOT_FOUND"
        );
        let answer = send(
            &router,
            execute_request(&call, &[("authorization", &internal)]),
        )
        .await;
        assert_eq!(answer.status, StatusCode::OK);
        let mcp = send(&router, mcp_call(&[("authorization", &internal)])).await;
        assert_eq!(mcp.status, StatusCode::OK);
        assert_eq!(
            mcp.json()["result"]["isError"],
            json!(false),
            "{}",
            mcp.json()
        );

        let authorizations = [
            [
                ("authorization", known.as_str()),
                ("authorization", internal.as_str()),
            ],
            [
                ("authorization", internal.as_str()),
                ("authorization", known.as_str()),
            ],
            [
                ("authorization", internal.as_str()),
                ("authorization", internal.as_str()),
            ],
        ];
        let versions = [
            [("carmy-version", "1"), ("carmy-version", "2")],
            [("carmy-version", "2"), ("carmy-version", "1")],
            [("carmy-version", "1.0"), ("carmy-version", "1.0")],
        ];
        for (headers, reason) in authorizations
            .iter()
            .map(|pair| (pair, "the request has more than one Authorization"))
            .chain(
                versions
                    .iter()
                    .map(|pair| (pair, "the request has more than one Carmy-Version")),
            )
        {
            let answer = send(&router, execute_request(&call, headers)).await;
            let error = error_of(&answer, StatusCode::BAD_REQUEST);
            assert_eq!(error["code"], "INVALID_REQUEST", "{headers:?}");
            assert_eq!(error["details"]["reason"], reason, "{headers:?}");
            assert_eq!(answer.header("carmy-version"), Some("1.0"));

            let answer = send(&router, mcp_call(headers)).await;
            assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{headers:?}");
            let body = answer.json();
            assert_eq!(body["jsonrpc"], "2.0");
            assert_eq!(body["error"]["code"], -32600, "{body}");
            assert_eq!(body["error"]["data"]["code"], "INVALID_REQUEST", "{body}");
            assert_eq!(body["error"]["data"]["details"]["reason"], reason, "{body}");
        }
    }
}

fn mcp_list(origin: &str) -> Request<Body> {
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": { "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    } } });
    Request::post("/mcp")
        .header("host", "localhost")
        .header("origin", origin)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/list")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn preflight(path: &str, origin: &str, headers: &str) -> Request<Body> {
    Request::options(path)
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", headers)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn one_origin_list_serves_cors_and_the_mcp_origin_check() {
    const MCP_HEADERS: [&str; 5] = [
        "mcp-session-id",
        "mcp-protocol-version",
        "mcp-method",
        "mcp-name",
        "last-event-id",
    ];
    let router = app(&Probe::default())
        .cors_allowed_origin("https://app.example.com")
        .mcp_allowed_origin("https://console.example.com")
        .router()
        .unwrap();
    for origin in ["https://app.example.com", "https://console.example.com"] {
        // The preflight grants the MCP headers…
        let answer = send(
            &router,
            preflight(
                "/mcp",
                origin,
                &format!("content-type, {}", MCP_HEADERS.join(", ")),
            ),
        )
        .await;
        assert_eq!(answer.header("access-control-allow-origin"), Some(origin));
        let allowed = answer
            .header("access-control-allow-headers")
            .unwrap()
            .to_ascii_lowercase();
        for header in MCP_HEADERS {
            assert!(allowed.contains(header), "{header} in {allowed}");
        }
        // …and the request it granted is served, exposing the session header.
        let answer = send(&router, mcp_list(origin)).await;
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "{origin}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(answer.header("access-control-allow-origin"), Some(origin));
        let exposed = answer
            .header("access-control-expose-headers")
            .unwrap()
            .to_ascii_lowercase();
        assert!(exposed.contains("mcp-session-id"), "{exposed}");
        // carmy/1 grants the same origins.
        let answer = send(&router, preflight("/agent/execute", origin, "content-type")).await;
        assert_eq!(answer.header("access-control-allow-origin"), Some(origin));
    }
    // An origin in neither is granted nothing, and refused by MCP.
    let answer = send(
        &router,
        preflight("/mcp", "https://evil.example", "content-type"),
    )
    .await;
    assert_eq!(answer.header("access-control-allow-origin"), None);
    let answer = send(&router, mcp_list("https://evil.example")).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn an_unknown_tool_suggests_the_nearest_visible_names() {
    let router = app(&Probe::default()).router().unwrap();
    let answer = execute(
        &router,
        &json!({ "tool": "ecoh", "arguments": { "text": "a" } }),
    )
    .await;
    let error = error_of(&answer, StatusCode::NOT_FOUND);
    assert_eq!(error["code"], "TOOL_NOT_FOUND");
    assert_eq!(error["details"]["suggestions"][0], "echo");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("did you mean `echo`"),
        "{error}"
    );

    // A tool the caller may not see is never suggested to it…
    let typo = json!({ "tool": "echo_internl", "arguments": { "text": "a" } });
    let answer = execute(&router, &typo).await;
    let error = error_of(&answer, StatusCode::NOT_FOUND);
    assert_eq!(error["details"]["suggestions"], json!(["echo"]), "{error}");
    assert!(!error.to_string().contains("echo_internal"), "{error}");

    // …but is to a caller who may.
    let mut request = execute_request(&typo, &[]);
    request
        .extensions_mut()
        .insert(Principal::new("ops", TrustLevel::Internal));
    let error = error_of(&send(&router, request).await, StatusCode::NOT_FOUND);
    assert_eq!(
        error["details"]["suggestions"][0], "echo_internal",
        "{error}"
    );

    // The same over MCP, in the JSON-RPC error's data.
    let body = json!({ "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "ecoh",
        "arguments": { "text": "a" },
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
        },
    } });
    let request = Request::post("/mcp")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", "ecoh")
        .body(Body::from(body.to_string()))
        .unwrap();
    let answer = send(&router, request).await;
    let error = &answer.json()["error"];
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("did you mean `echo`"),
        "{error}"
    );
    assert_eq!(
        error["data"]["details"]["suggestions"],
        json!(["echo"]),
        "{error}"
    );

    // Nothing near: no suggestion.
    let answer = execute(&router, &json!({ "tool": "zzzzzz" })).await;
    let error = error_of(&answer, StatusCode::NOT_FOUND);
    assert_eq!(error["details"]["suggestions"], json!([]));
    assert_eq!(error["message"], "no tool named `zzzzzz`");
}

#[tokio::test]
async fn enum_and_one_of_failures_name_the_allowed_values() {
    let router = app(&Probe::default()).router().unwrap();
    let answer = execute(
        &router,
        &json!({ "tool": "paint", "arguments": {
            "colour": "blue",
            "payment": { "kind": "cheque" },
        } }),
    )
    .await;
    let error = error_of(&answer, StatusCode::BAD_REQUEST);
    let errors = error["details"]["errors"].as_array().unwrap();
    let at = |path: &str| {
        errors
            .iter()
            .find(|violation| violation["path"] == path)
            .unwrap_or_else(|| panic!("no violation at {path}: {error}"))["message"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let colour = at("/colour");
    assert!(
        colour.contains("\"red\"") && colour.contains("\"green\""),
        "{colour}"
    );
    assert!(!colour.contains("any of the schemas"), "{colour}");
    let payment = at("/payment");
    assert!(
        payment.contains("\"card\"") && payment.contains("\"cash\""),
        "{payment}"
    );
    assert!(!payment.contains("any of the schemas"), "{payment}");
}
