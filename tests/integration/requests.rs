//! Requests: duplicated headers are refused, CORS covers `/mcp` with one origin list,
//! an unknown tool gets "did you mean", and `enum`/`oneOf` failures name the allowed values.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::auth::{TokenAuthenticator, hash_token};
use carmy::{JsonSchema, Principal, State, ToolError, TrustLevel};
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
    let config = carmy::config::Config::parse(
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

/// Counts its calls; it takes no arguments, so that an empty body could call it.
#[carmy::tool(effect = "write", register = false)]
async fn tally(State(probe): State<Probe>) -> Result<Text, ToolError> {
    let run = probe.runs.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(Text {
        text: run.to_string(),
    })
}

/// The server's address as the tests' requests name it in `Host`.
const HOST: &str = "shop.example:8080";
/// A page of another site.
const EVIL: &str = "https://evil.example";
/// The origin the configuration allows.
const ALLOWED: &str = "https://app.example.com";

/// The test tools and `tally`, with the tokens, events (for the subscription routes) and one
/// allowed origin.
fn origin_app(probe: &Probe) -> axum::Router {
    let config = carmy::config::Config::parse(
        &format!(
            "[cors]\nallowed_origins = [\"{ALLOWED}\"]\n\n\
             [[tokens]]\nid = \"ops\"\ntrust = \"internal\"\nhash = \"{}\"\n\n\
             [events]\nallow_http = true\nallow_networks = [\"127.0.0.0/8\"]\n",
            hash_token(INTERNAL_TOKEN)
        ),
        |_| None,
    )
    .unwrap();
    app(probe)
        .tool(tally::TOOL)
        .config(config)
        .router()
        .unwrap()
}

/// What a page can make a browser send without a preflight: `Origin`, and a body of a
/// CORS-safelisted type (or none). The internal token stands for a credential the browser
/// would add by itself (a host's cookie-based authenticator).
fn simple_request(
    method: &str,
    path: &str,
    origin: Option<&str>,
    content_type: Option<&str>,
    body: &str,
) -> Request<Body> {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", HOST)
        .header("authorization", format!("Bearer {INTERNAL_TOKEN}"));
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    if let Some(content_type) = content_type {
        request = request.header("content-type", content_type);
    }
    request.body(Body::from(body.to_owned())).unwrap()
}

/// Every route that runs something or changes state, with the bodies a page can send to it.
fn state_changing_requests() -> Vec<(&'static str, String, Option<&'static str>, &'static str)> {
    let call = r#"{"tool":"tally"}"#;
    let subscription = r#"{"url":"http://127.0.0.1:9/hook","event_types":["tools.changed"]}"#;
    let one = "/agent/events/subscriptions/sub_0";
    let mut requests = vec![
        (
            "POST",
            "/agent/execute".to_owned(),
            Some("text/plain"),
            call,
        ),
        (
            "POST",
            "/agent/execute".to_owned(),
            Some("application/json"),
            call,
        ),
        (
            "POST",
            "/agent/tools/tally".to_owned(),
            Some("text/plain"),
            "{}",
        ),
        (
            "POST",
            "/agent/tools/tally".to_owned(),
            Some("text/plain"),
            "",
        ),
        (
            "POST",
            "/agent/tools/tally".to_owned(),
            Some("application/x-www-form-urlencoded"),
            "a=b",
        ),
        (
            "POST",
            "/agent/tools/tally".to_owned(),
            Some("multipart/form-data; boundary=x"),
            "",
        ),
        ("POST", "/agent/tools/tally".to_owned(), None, ""),
        (
            "POST",
            "/agent/tools/tally".to_owned(),
            Some("application/json"),
            "{}",
        ),
        ("DELETE", "/agent/executions/exec_x".to_owned(), None, ""),
        ("POST", "/agent/admin/reload".to_owned(), None, ""),
        (
            "POST",
            "/agent/events/subscriptions".to_owned(),
            Some("text/plain"),
            subscription,
        ),
        ("DELETE", one.to_owned(), None, ""),
        (
            "PATCH",
            one.to_owned(),
            Some("text/plain"),
            r#"{"enabled":false}"#,
        ),
        ("POST", format!("{one}/rotate-secret"), None, ""),
        ("PUT", "/agent/nowhere".to_owned(), Some("text/plain"), "x"),
    ];
    requests.sort_by_key(|(method, path, ..)| (*method, path.clone()));
    requests
}

/// A page on another site runs nothing: whatever it sends (a `no-cors` fetch with a
/// `text/plain` body, a form, an empty body) to any route that runs something or changes state
/// is `403 ORIGIN_NOT_ALLOWED` before anything is read, and `Origin: null` likewise; reading
/// the public documents stays open to it.
#[tokio::test]
async fn a_page_of_another_origin_runs_nothing() {
    let probe = Probe::default();
    let router = origin_app(&probe);
    for origin in [
        EVIL,
        "null",
        "http://shop.example:8081",
        "http://localhost:8080",
    ] {
        for (method, path, content_type, body) in state_changing_requests() {
            let request = simple_request(method, &path, Some(origin), content_type, body);
            let answer = send(&router, request).await;
            let error = error_of(&answer, StatusCode::FORBIDDEN);
            assert_eq!(
                error["code"], "ORIGIN_NOT_ALLOWED",
                "{method} {path} from {origin}"
            );
            assert_eq!(error["category"], "permission");
            assert_eq!(answer.header("content-type"), Some("application/json"));
            assert_eq!(answer.header("carmy-version"), Some("1.0"));
            assert_eq!(answer.header("access-control-allow-origin"), None);
        }
    }
    assert_eq!(probe.runs(), 0, "a tool ran for another origin");
    // Nothing was subscribed either.
    let listed = simple_request("GET", "/agent/events/subscriptions", None, None, "");
    let listed = send(&router, listed).await;
    assert_eq!(listed.status, StatusCode::OK);
    assert_eq!(listed.json()["subscriptions"], json!([]));

    // The documents are public, to any page.
    for path in [
        "/agent/tools",
        "/.well-known/agent",
        "/agent/openapi.json",
        "/agent/health",
    ] {
        let answer = send(&router, simple_request("GET", path, Some(EVIL), None, "")).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
    }
}

/// The server's own pages (the console; the browser sends `Origin` on its POSTs), the allowed
/// origins and clients that send no `Origin` are served as before.
#[tokio::test]
async fn the_servers_own_and_allowed_origins_are_served() {
    let probe = Probe::default();
    let router = origin_app(&probe);
    let json = Some("application/json");
    let mut runs = 0;
    for origin in [
        Some("http://shop.example:8080"),
        Some("https://SHOP.example:8080"),
        Some(ALLOWED),
        None,
    ] {
        let call = r#"{"tool":"tally"}"#;
        for (path, body) in [("/agent/execute", call), ("/agent/tools/tally", "{}")] {
            let answer = send(&router, simple_request("POST", path, origin, json, body)).await;
            assert_eq!(answer.status, StatusCode::OK, "{path} from {origin:?}");
            runs += 1;
            assert_eq!(answer.json()["data"]["text"], runs.to_string());
            let granted = origin.filter(|origin| *origin == ALLOWED);
            assert_eq!(answer.header("access-control-allow-origin"), granted);
        }
        let subscription =
            json!({ "url": "http://127.0.0.1:9/hook", "event_types": ["tools.changed"] });
        let created = simple_request(
            "POST",
            "/agent/events/subscriptions",
            origin,
            json,
            &subscription.to_string(),
        );
        let created = send(&router, created).await;
        assert_eq!(created.status, StatusCode::CREATED, "from {origin:?}");
        let id = created.json()["id"].as_str().unwrap().to_owned();
        let path = format!("/agent/events/subscriptions/{id}");
        let deleted = send(&router, simple_request("DELETE", &path, origin, None, "")).await;
        assert_eq!(deleted.status, StatusCode::NO_CONTENT, "from {origin:?}");
        // Without a configuration file the reload is refused by the reload itself.
        let reload = simple_request("POST", "/agent/admin/reload", origin, None, "");
        let reload = send(&router, reload).await;
        assert_eq!(reload.json()["error"]["code"], "CONFIG_INVALID");
    }
    assert_eq!(probe.runs(), runs);
}

/// The per-tool route takes its arguments as `application/json` only, as execute does: a
/// body of another type, or an empty body without the type, is `400 INVALID_REQUEST` and runs
/// nothing; an empty body declared JSON is `{}`.
#[tokio::test]
async fn the_tool_route_takes_json_only() {
    let probe = Probe::default();
    let router = app(&probe).tool(tally::TOOL).router().unwrap();
    let tool = |content_type: Option<&str>, body: &str| {
        let mut request = Request::post("/agent/tools/tally");
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        request.body(Body::from(body.to_owned())).unwrap()
    };
    for (content_type, body) in [
        (None, ""),
        (None, "{}"),
        (Some("text/plain"), ""),
        (Some("text/plain"), "{}"),
        (Some("application/x-www-form-urlencoded"), ""),
        (Some("application/x-www-form-urlencoded"), "a=b"),
        (Some("multipart/form-data; boundary=x"), ""),
    ] {
        let answer = send(&router, tool(content_type, body)).await;
        let error = error_of(&answer, StatusCode::BAD_REQUEST);
        assert_eq!(
            error["code"], "INVALID_REQUEST",
            "{content_type:?} {body:?}"
        );
        assert_eq!(
            error["details"]["reason"],
            "the content type must be application/json"
        );
        assert_eq!(answer.header("cache-control"), Some("no-store"));
    }
    assert_eq!(probe.runs(), 0);
    for body in ["", "{}"] {
        let answer = send(&router, tool(Some("application/json; charset=utf-8"), body)).await;
        assert_eq!(answer.status, StatusCode::OK, "{body:?}");
    }
    assert_eq!(probe.runs(), 2);
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
