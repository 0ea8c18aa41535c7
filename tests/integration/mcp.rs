//! MCP at `/mcp` (feature `mcp`), through the router in-process and over loopback sockets:
//! the transport rules of both protocol generations (versions, headers that mirror the body,
//! origins, credentials, notifications, malformed and cut bodies) and the tool list each caller
//! sees; and the requests and sessions that `mcp_calls` and `mcp_lifecycle` share. The official
//! clients drive the example server in `mcp_clients`; the session caps are `mcp_sessions`'.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy_tests::{Answer, Server, send};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::tools::{self, Probe};

pub(crate) const MODERN: &str = "2026-07-28";

/// A `/mcp` POST with the given headers.
pub(crate) fn post(body: &Value, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::post("/mcp")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(Body::from(body.to_string()))
        .expect("valid request")
}

/// A 2026-07-28 request: the `_meta` envelope, and the headers that mirror the body.
pub(crate) fn modern(id: u64, method: &str, mut params: Value) -> Request<Body> {
    params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!(MODERN);
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] = json!({});
    let name = params["name"].as_str().map(str::to_owned);
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    let mut headers = vec![("mcp-protocol-version", MODERN), ("mcp-method", method)];
    if let Some(name) = &name {
        headers.push(("mcp-name", name));
    }
    post(&body, &headers)
}

pub(crate) fn modern_with(
    id: u64,
    method: &str,
    params: Value,
    header: (&str, &'static str),
) -> Request<Body> {
    let mut request = modern(id, method, params);
    request.headers_mut().insert(
        header
            .0
            .to_owned()
            .parse::<axum::http::HeaderName>()
            .unwrap(),
        header.1.parse().unwrap(),
    );
    request
}

/// A 2026-07-28 `tools/call`.
pub(crate) fn call(id: u64, tool: &str, arguments: Value, meta: Value) -> Request<Body> {
    let mut params = json!({ "name": tool });
    params["arguments"] = arguments;
    params["_meta"] = meta;
    modern(id, "tools/call", params)
}

/// The JSON-RPC `result` of a JSON answer.
pub(crate) fn result(answer: &Answer) -> Value {
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let body = answer.json();
    assert_eq!(body["jsonrpc"], "2.0");
    body["result"].clone()
}

/// The JSON-RPC `error` of an answer, checking its HTTP status.
pub(crate) fn rpc_error(answer: &Answer, status: StatusCode) -> Value {
    assert_eq!(
        answer.status,
        status,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.header("content-type"), Some("application/json"));
    answer.json()["error"].clone()
}

pub(crate) fn router(probe: &Probe) -> axum::Router {
    tools::app(probe).router().unwrap()
}

/// A 2025-11-25 session: its id and negotiated version.
pub(crate) struct Session {
    pub(crate) id: String,
}

impl Session {
    pub(crate) fn headers(&self) -> [(&str, &str); 2] {
        [
            ("mcp-session-id", &self.id),
            ("mcp-protocol-version", "2025-11-25"),
        ]
    }
}

pub(crate) fn initialize(version: &str) -> Request<Body> {
    let body = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": version,
            "capabilities": {},
            "clientInfo": { "name": "carmy-tests", "version": "1" }
        }
    });
    post(&body, &[])
}

/// The one JSON-RPC message of an event-stream answer.
pub(crate) fn sse_reply(body: &[u8]) -> Value {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    parse_sse_data(&text).pop().expect("a reply")
}

pub(crate) fn parse_sse_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .filter(|data| !data.is_empty())
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

pub(crate) fn session_of(answer: &Answer) -> Session {
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        sse_reply(&answer.body)["result"]["protocolVersion"],
        "2025-11-25"
    );
    Session {
        id: answer
            .header("mcp-session-id")
            .expect("a session id")
            .to_owned(),
    }
}

pub(crate) async fn handshake(router: &axum::Router) -> Session {
    session_of(&send(router, initialize("2025-11-25")).await)
}

pub(crate) async fn handshake_over(server: &Server) -> Session {
    let session = session_of(&server.send(initialize("2025-11-25")).await);
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let answer = server.send(post(&initialized, &session.headers())).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    session
}

/// A `tools/call` of a session (2025-11-25): no `_meta` of the stateless generation.
pub(crate) fn session_call(id: u64, tool: &str, arguments: Value, meta: Value) -> Value {
    let mut call = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": tool }
    });
    call["params"]["arguments"] = arguments;
    call["params"]["_meta"] = meta;
    call
}

#[tokio::test]
async fn tools_list_describes_every_tool_with_hints_and_carmy_metadata() {
    let router = shop::app().router().unwrap();
    let listed = result(&send(&router, modern(1, "tools/list", json!({}))).await);
    assert_eq!(listed["resultType"], "complete");
    assert_eq!(listed["ttlMs"], 60_000);
    assert_eq!(listed["cacheScope"], "private");
    let tools = listed["tools"].as_array().unwrap();
    let names: Vec<&str> = tools
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cancel_order",
            "create_order",
            "generate_report",
            "get_order",
            "list_products"
        ]
    );

    let catalog = carmy_tests::get(&router, "/agent/tools").await.json();
    for (tool, entry) in tools.iter().zip(catalog["tools"].as_array().unwrap()) {
        assert_eq!(tool["description"], entry["description"]);
        assert_eq!(tool["inputSchema"], entry["input_schema"]);
        assert_eq!(tool["outputSchema"], entry["output_schema"]);
        let meta = &tool["_meta"]["dev.carmy/tool"];
        for field in ["effect", "idempotent", "parallel_safe", "confirmation"] {
            assert_eq!(meta[field], entry[field], "{field} of {}", tool["name"]);
        }
    }
    let hints = |name: &str| {
        let tool = tools.iter().find(|tool| tool["name"] == name).unwrap();
        let annotations = &tool["annotations"];
        [
            annotations["readOnlyHint"].as_bool().unwrap(),
            annotations["destructiveHint"].as_bool().unwrap(),
            annotations["idempotentHint"].as_bool().unwrap(),
            annotations["openWorldHint"].as_bool().unwrap(),
        ]
    };
    assert_eq!(hints("get_order"), [true, false, true, false]);
    assert_eq!(hints("generate_report"), [true, false, true, false]);
    assert_eq!(hints("create_order"), [false, false, false, false]);
    assert_eq!(hints("cancel_order"), [false, true, true, false]);
    let create = tools
        .iter()
        .find(|tool| tool["name"] == "create_order")
        .unwrap();
    assert_eq!(create["title"], "Create order");
}

#[tokio::test]
async fn server_discover_names_both_generations() {
    let router = shop::app().router().unwrap();
    let discovered = result(&send(&router, modern(1, "server/discover", json!({}))).await);
    let versions = discovered["supportedVersions"].as_array().unwrap();
    assert!(versions.contains(&json!("2026-07-28")), "{versions:?}");
    assert!(versions.contains(&json!("2025-11-25")), "{versions:?}");
    assert!(discovered["capabilities"]["tools"].is_object());
    assert_eq!(discovered["resultType"], "complete");
}

#[tokio::test]
async fn headers_that_disagree_with_the_body_are_refused() {
    let router = shop::app().router().unwrap();
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": "list_products", "arguments": {},
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": MODERN,
                "io.modelcontextprotocol/clientCapabilities": {}
            }
        }
    });
    let cases: [&[(&str, &str)]; 4] = [
        &[
            ("mcp-protocol-version", MODERN),
            ("mcp-method", "tools/list"),
            ("mcp-name", "list_products"),
        ],
        &[
            ("mcp-protocol-version", MODERN),
            ("mcp-method", "tools/call"),
            ("mcp-name", "get_order"),
        ],
        &[
            ("mcp-protocol-version", "2025-11-25"),
            ("mcp-method", "tools/call"),
            ("mcp-name", "list_products"),
        ],
        &[
            ("mcp-protocol-version", MODERN),
            ("mcp-name", "list_products"),
        ],
    ];
    for headers in cases {
        let answer = send(&router, post(&body, headers)).await;
        let error = rpc_error(&answer, StatusCode::BAD_REQUEST);
        assert_eq!(error["code"], -32020, "{headers:?}: {error}");
        assert_eq!(answer.json()["id"], 1);
    }
    let agreeing = [
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "tools/call"),
        ("mcp-name", "list_products"),
    ];
    let answer = send(&router, post(&body, &agreeing)).await;
    assert_eq!(result(&answer)["isError"], false);
}

#[tokio::test]
async fn unsupported_versions_are_refused_with_the_supported_ones() {
    let router = shop::app().router().unwrap();
    let body = json!({
        "jsonrpc": "2.0", "id": 7, "method": "tools/list",
        "params": { "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2099-01-01",
            "io.modelcontextprotocol/clientCapabilities": {}
        } }
    });
    let headers = [
        ("mcp-protocol-version", "2099-01-01"),
        ("mcp-method", "tools/list"),
    ];
    let answer = send(&router, post(&body, &headers)).await;
    let error = rpc_error(&answer, StatusCode::BAD_REQUEST);
    assert_eq!(error["code"], -32022);
    assert_eq!(error["data"]["requested"], "2099-01-01");
    let supported = error["data"]["supported"].as_array().unwrap();
    assert!(supported.contains(&json!("2026-07-28")) && supported.contains(&json!("2025-11-25")));

    // A 2026-07-28 request without its envelope is invalid, not a legacy one.
    let headers = [
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "tools/list"),
    ];
    let bare = json!({ "jsonrpc": "2.0", "id": 8, "method": "tools/list", "params": {} });
    let error = rpc_error(
        &send(&router, post(&bare, &headers)).await,
        StatusCode::BAD_REQUEST,
    );
    assert_eq!(error["code"], -32602);

    // `initialize` with an unknown version is answered with the newest handshake version.
    let answer = send(&router, initialize("1999-01-01")).await;
    assert_eq!(answer.status, StatusCode::OK);
    let reply = sse_reply(&answer.body);
    assert_eq!(reply["result"]["protocolVersion"], "2025-11-25");
    assert_eq!(reply["result"]["serverInfo"]["name"], "shop");
}

#[tokio::test]
async fn unsupported_methods_are_not_found() {
    let router = shop::app().router().unwrap();
    let answer = send(&router, modern(3, "resources/list", json!({}))).await;
    assert_eq!(rpc_error(&answer, StatusCode::NOT_FOUND)["code"], -32601);

    let wrong_method = Request::put("/mcp")
        .header("host", "localhost")
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, wrong_method).await;
    assert_eq!(
        rpc_error(&answer, StatusCode::METHOD_NOT_ALLOWED)["code"],
        -32600
    );
    assert!(answer.header("allow").unwrap().contains("POST"));
}

#[tokio::test]
async fn foreign_origins_are_refused() {
    let router = shop::app()
        .mcp_allowed_origin("https://app.example.com")
        .router()
        .unwrap();
    let list = |origin: &'static str| modern_with(1, "tools/list", json!({}), ("origin", origin));
    for origin in [
        "http://evil.example",
        "null",
        "http://localhost.evil.example:3000",
    ] {
        let answer = send(&router, list(origin)).await;
        let error = rpc_error(&answer, StatusCode::FORBIDDEN);
        assert_eq!(error["data"]["code"], "ORIGIN_NOT_ALLOWED", "{origin}");
        assert_eq!(answer.json()["id"], Value::Null);
    }
    for origin in [
        "http://localhost:6274",
        "http://127.0.0.1:3000",
        "https://app.example.com",
    ] {
        let answer = send(&router, list(origin)).await;
        assert_eq!(answer.status, StatusCode::OK, "{origin}");
    }
    // The legacy handshake is gated the same way.
    let mut handshake = initialize("2025-11-25");
    handshake
        .headers_mut()
        .insert("origin", "http://evil.example".parse().unwrap());
    assert_eq!(send(&router, handshake).await.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn bad_credentials_are_refused_before_mcp() {
    let probe = Probe::default();
    let router = tools::app(&probe)
        .authenticator(crate::auth::OneToken)
        .router()
        .unwrap();
    let request = modern_with(1, "tools/list", json!({}), ("authorization", "Bearer bad"));
    let answer = send(&router, request).await;
    let error = rpc_error(&answer, StatusCode::UNAUTHORIZED);
    assert_eq!(error["data"]["code"], "UNAUTHENTICATED");
    assert!(answer.header("www-authenticate").is_some());

    // Good credentials carry the caller, and its permissions, into the call.
    let mut request = call(2, "wipe", json!({}), json!({}));
    request
        .headers_mut()
        .insert("authorization", "Bearer good".parse().unwrap());
    let called = result(&send(&router, request).await);
    assert_eq!(called["isError"], false, "{called}");
    assert_eq!(called["structuredContent"]["text"], "wiped by agent-1");
}

#[tokio::test]
async fn notifications_are_accepted_with_202() {
    let router = shop::app().router().unwrap();
    let notification = json!({
        "jsonrpc": "2.0", "method": "notifications/cancelled", "params": { "requestId": 9 }
    });
    let headers = [
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "notifications/cancelled"),
    ];
    let answer = send(&router, post(&notification, &headers)).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    assert!(answer.body.is_empty());

    let session = handshake(&router).await;
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let answer = send(&router, post(&initialized, &session.headers())).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
}

/// Over a socket: a body of unknown length (chunked) is left to the SDK, one beyond the SDK's
/// limit is refused with `413`, and a body cut short by the client gets a JSON-RPC error with
/// `400`, not plain text.
#[tokio::test]
async fn calls_with_chunked_excessive_or_short_bodies() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let probe = Probe::default();
    let server = Server::start(router(&probe)).await;

    let (parts, body) = call(1, "echo", json!({ "text": "a" }), json!({})).into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    let chunked = Body::from_stream(futures_util::stream::iter([Ok::<_, std::io::Error>(
        body.clone(),
    )]));
    let answer = server.send(Request::from_parts(parts, chunked)).await;
    assert_eq!(result(&answer)["structuredContent"], json!({ "text": "a" }));

    let big = "x".repeat(5 * 1024 * 1024);
    let answer = server
        .send(call(2, "echo", json!({ "text": big }), json!({})))
        .await;
    let error = rpc_error(&answer, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error["code"], -32600);
    assert_eq!(error["data"]["code"], "PAYLOAD_TOO_LARGE");
    assert_eq!(error["data"]["details"]["limit_bytes"], 4 * 1024 * 1024);

    // Half the body, then the client stops sending.
    let head = format!(
        "POST /mcp HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         accept: application/json, text/event-stream\r\nmcp-protocol-version: {MODERN}\r\n\
         mcp-method: tools/call\r\nmcp-name: echo\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut socket = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    socket.write_all(head.as_bytes()).await.unwrap();
    socket.write_all(&body[..body.len() / 2]).await.unwrap();
    socket.shutdown().await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(5), socket.read_to_string(&mut answer))
        .await
        .expect("answered within 5 s")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("content-type: application/json"),
        "{answer}"
    );
    assert!(answer.contains("\"code\":-32600"), "{answer}");
    assert!(answer.contains("\"code\":\"INVALID_REQUEST\""), "{answer}");
    assert_eq!(probe.runs(), 0);
}

/// A body that does not arrive within the body deadline is `408`, as on every other route,
/// whether the call would be answered directly or by the SDK.
#[tokio::test]
async fn a_stalled_body_is_a_json_rpc_408() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let app = tools::app(&Probe::default()).body_timeout(Duration::from_secs(1));
    let server = Server::start(app.router().unwrap()).await;
    let direct =
        format!("mcp-protocol-version: {MODERN}\r\nmcp-method: tools/call\r\nmcp-name: echo\r\n");
    for extra in [direct.as_str(), ""] {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\n{extra}content-length: 100\r\n\r\n{{"
        );
        let mut socket = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        socket.write_all(head.as_bytes()).await.unwrap();
        let mut answer = vec![0; 4096];
        let read = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut answer))
            .await
            .expect("answered within 5 s")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]);
        assert!(answer.starts_with("HTTP/1.1 408"), "{extra:?}: {answer}");
        assert!(answer.contains("\"code\":-32600"), "{answer}");
        assert!(answer.contains("\"code\":\"REQUEST_TIMEOUT\""), "{answer}");
    }
}

/// A body that is not JSON is a JSON-RPC parse error (`-32700`), and JSON that is no JSON-RPC
/// message an invalid request (`-32600`), both with `400`; a body that is not declared JSON
/// stays a `415`.
#[tokio::test]
async fn malformed_bodies_are_parse_errors_and_invalid_requests() {
    let router = router(&Probe::default());
    let raw = |body: &'static str, headers: &[(&str, &str)]| {
        let mut request = Request::post("/mcp")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.body(Body::from(body)).unwrap()
    };
    let direct = [
        ("mcp-protocol-version", MODERN),
        ("mcp-method", "tools/call"),
        ("mcp-name", "echo"),
    ];
    for headers in [&direct[..], &[]] {
        for (body, code) in [
            ("{\"jsonrpc\": \"2.0\", \"id\": 1,", -32700),
            ("not json", -32700),
            ("{\"jsonrpc\": \"2.0\", \"id\": 1}", -32600),
            ("[1, 2]", -32600),
        ] {
            let answer = send(&router, raw(body, headers)).await;
            let error = rpc_error(&answer, StatusCode::BAD_REQUEST);
            assert_eq!(error["code"], code, "{body}: {error}");
            assert_eq!(answer.json()["id"], Value::Null);
        }
    }
    let mut text = raw("{}", &[]);
    text.headers_mut()
        .insert("content-type", "text/plain".parse().unwrap());
    let answer = send(&router, text).await;
    rpc_error(&answer, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

#[tokio::test]
async fn tools_list_and_calls_hide_what_the_caller_may_not_use() {
    let tokens = carmy::auth::TokenAuthenticator::new()
        .token(
            &carmy::auth::hash_token("known"),
            carmy::Principal::new("reporting", carmy::TrustLevel::Known),
        )
        .unwrap();
    let router = shop::app().authenticator(tokens).router().unwrap();
    let names = |listed: &Value| -> Vec<String> {
        listed["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let anonymous = result(&send(&router, modern(1, "tools/list", json!({}))).await);
    assert!(!names(&anonymous).contains(&"sales_summary".to_owned()));
    let known = result(
        &send(
            &router,
            modern_with(
                2,
                "tools/list",
                json!({}),
                ("authorization", "Bearer known"),
            ),
        )
        .await,
    );
    assert!(names(&known).contains(&"sales_summary".to_owned()));
    assert_eq!(names(&known).len(), names(&anonymous).len() + 1);

    let hidden = send(&router, call(3, "sales_summary", json!({}), json!({}))).await;
    let missing = send(&router, call(3, "sales_summarx", json!({}), json!({}))).await;
    assert_eq!(hidden.status, missing.status);
    assert_eq!(hidden.json()["error"]["data"]["code"], "TOOL_NOT_FOUND");
    assert_eq!(
        hidden.json().to_string().replace("sales_summary", "TOOL"),
        missing.json().to_string().replace("sales_summarx", "TOOL")
    );
}
