//! MCP at `/mcp` (feature `mcp`), through the router in-process and over loopback sockets: the
//! transport rules of both protocol generations, and the runtime's semantics behind
//! `tools/call`. The official clients drive the example server in `mcp_clients`.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::{Principal, TrustLevel};
use carmy_tests::wait::{PATIENCE, until};
use carmy_tests::{Answer, Server, Serving, parse_sse, send};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::tools::{self, Probe};

const MODERN: &str = "2026-07-28";

/// A `/mcp` POST with the given headers.
fn post(body: &Value, headers: &[(&str, &str)]) -> Request<Body> {
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
fn modern(id: u64, method: &str, mut params: Value) -> Request<Body> {
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

/// A 2026-07-28 `tools/call`.
pub(crate) fn call(id: u64, tool: &str, arguments: Value, meta: Value) -> Request<Body> {
    let mut params = json!({ "name": tool });
    params["arguments"] = arguments;
    params["_meta"] = meta;
    modern(id, "tools/call", params)
}

/// The JSON-RPC `result` of a JSON answer.
fn result(answer: &Answer) -> Value {
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
fn rpc_error(answer: &Answer, status: StatusCode) -> Value {
    assert_eq!(
        answer.status,
        status,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.header("content-type"), Some("application/json"));
    answer.json()["error"].clone()
}

fn router(probe: &Probe) -> axum::Router {
    tools::app(probe).router().unwrap()
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

fn modern_with(
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

#[tokio::test]
async fn tools_call_answers_structured_content_or_the_carmy_error() {
    let router = shop::app().router().unwrap();
    let called = result(
        &send(
            &router,
            call(1, "get_order", json!({ "order_id": 99 }), json!({})),
        )
        .await,
    );
    assert_eq!(called["isError"], true);
    assert!(called.get("structuredContent").is_none(), "{called}");
    let error = &called["_meta"]["dev.carmy/error"];
    assert_eq!(error["code"], "ORDER_NOT_FOUND");
    assert_eq!(error["category"], "not_found");
    assert_eq!(error["retryable"], false);
    assert_eq!(
        serde_json::from_str::<Value>(called["content"][0]["text"].as_str().unwrap()).unwrap(),
        *error
    );
    assert_eq!(called["_meta"]["dev.carmy/status"], "failed");

    let placed = result(
        &send(
            &router,
            call(2, "create_order", json!({ "sku": "KB-01" }), json!({})),
        )
        .await,
    );
    assert_eq!(placed["isError"], false);
    assert_eq!(placed["structuredContent"], json!({ "order_id": 1 }));
    assert_eq!(
        placed["content"][0],
        json!({ "type": "text", "text": "{\"order_id\":1}" })
    );
    assert!(
        placed["_meta"]["dev.carmy/execution_id"]
            .as_str()
            .unwrap()
            .starts_with("exec_")
    );

    // A protocol error, answered in-band (`200`): the SDK keeps `400` for malformed envelopes.
    let unknown = send(&router, call(3, "no_such_tool", json!({}), json!({}))).await;
    let error = rpc_error(&unknown, StatusCode::OK);
    assert_eq!(error["code"], -32602);
    assert_eq!(error["data"]["code"], "TOOL_NOT_FOUND");
}

/// `request` answered as it is and again with a weighted `Accept` value, which the direct
/// stateless path leaves to the SDK: status, type and body, execution ids masked.
async fn directly_and_by_the_sdk(
    router: &axum::Router,
    make: impl Fn() -> Request<Body>,
) -> [(StatusCode, Option<String>, String); 2] {
    let mut by_sdk = make();
    by_sdk.headers_mut().append(
        "accept",
        axum::http::HeaderValue::from_static("application/json;q=1"),
    );
    let mut answers = Vec::new();
    for request in [make(), by_sdk] {
        let answer = send(router, request).await;
        let content_type = answer.header("content-type").map(str::to_owned);
        let body = mask_execution_ids(&String::from_utf8_lossy(&answer.body));
        answers.push((answer.status, content_type, body));
    }
    answers.try_into().expect("two answers")
}

/// `exec_…` ids replaced by `exec_*`: they differ from one execution to the next.
fn mask_execution_ids(text: &str) -> String {
    let mut masked = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("exec_") {
        masked.push_str(&rest[..at]);
        masked.push_str("exec_*");
        rest = rest[at + "exec_".len()..]
            .trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    }
    masked.push_str(rest);
    masked
}

/// The calls whose direct answers are compared with the SDK's: a result, tool errors, refusals,
/// a protocol error, a malformed key, a bad trace context, and a `count` with the key `key`,
/// which runs on its first call and is replayed on the second.
fn direct_cases(key: &str) -> [(&'static str, Value, Value); 8] {
    [
        ("echo", json!({ "text": "a" }), json!({})),
        ("refuse", json!({}), json!({})),
        ("picky", json!({ "word": 5 }), json!({})),
        ("wipe", json!({}), json!({})),
        ("no_such_tool", json!({}), json!({})),
        (
            "echo",
            json!({ "text": "a" }),
            json!({ "dev.carmy/request_id": 5 }),
        ),
        (
            "count",
            json!({ "text": "a" }),
            json!({ "dev.carmy/request_id": key }),
        ),
        (
            "echo",
            json!({ "text": "a" }),
            json!({ "traceparent": "not a trace" }),
        ),
    ]
}

/// A plain stateless `tools/call` is answered without the SDK's machinery: the answer must be
/// the SDK's to the byte, for results, tool errors, refusals, replays and protocol errors.
#[tokio::test]
async fn a_direct_answer_is_the_sdks_to_the_byte() {
    let probe = Probe::default();
    let router = router(&probe);
    let cases = direct_cases("both-ways");
    for (id, (tool, arguments, meta)) in (1..).zip(cases) {
        let [direct, sdk] =
            directly_and_by_the_sdk(&router, || call(id, tool, arguments.clone(), meta.clone()))
                .await;
        if tool == "count" {
            // The replay differs from the first answer in `replayed` only.
            let first = direct.2.replace(
                "\"dev.carmy/replayed\":false",
                "\"dev.carmy/replayed\":true",
            );
            assert_eq!((direct.0, &direct.1, first), (sdk.0, &sdk.1, sdk.2.clone()));
            assert!(
                direct.2.contains("\"dev.carmy/replayed\":false"),
                "{}",
                direct.2
            );
            continue;
        }
        assert_eq!(direct, sdk, "{tool} {arguments} {meta}");
    }
    assert_eq!(probe.runs(), 1 + 2, "refuse twice, count once");
}

/// A plain `tools/call` of a session is answered as JSON without the session's worker: the
/// message must be the one the SDK streams, to the byte, for the same cases as above.
#[tokio::test]
async fn a_direct_answer_in_a_session_is_the_message_the_sdk_streams() {
    let probe = Probe::default();
    let router = router(&probe);
    let session = handshake(&router).await;
    let cases = direct_cases("both-ways-in-a-session");
    for (id, (tool, arguments, meta)) in (1..).zip(cases) {
        let body = session_call(id, tool, arguments, meta);
        let direct = send(&router, post(&body, &session.headers())).await;
        assert_eq!(direct.status, StatusCode::OK, "{body}");
        assert_eq!(direct.header("content-type"), Some("application/json"));
        // A weighted `Accept` value leaves the call to the SDK.
        let mut by_sdk = post(&body, &session.headers());
        by_sdk.headers_mut().append(
            "accept",
            axum::http::HeaderValue::from_static("application/json;q=1"),
        );
        let streamed = send(&router, by_sdk).await;
        assert_eq!(streamed.status, StatusCode::OK, "{body}");
        assert_eq!(streamed.header("content-type"), Some("text/event-stream"));
        let direct = mask_execution_ids(&String::from_utf8_lossy(&direct.body));
        let streamed = String::from_utf8_lossy(&streamed.body).replace("\r\n", "\n");
        let message = streamed
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(str::trim)
            .rfind(|data| !data.is_empty())
            .expect("a message");
        let mut streamed = mask_execution_ids(message);
        if tool == "count" {
            // The SDK replays the call that ran directly.
            streamed = streamed.replace(
                "\"dev.carmy/replayed\":true",
                "\"dev.carmy/replayed\":false",
            );
        }
        assert_eq!(direct, streamed, "{body}");
    }
    assert_eq!(probe.runs(), 1 + 2, "refuse twice, count once");
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

/// Over sockets, the agent's question: sixty-four direct calls at once with one key, as an
/// agent retrying after timeouts sends them, run the tool once and all get its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_direct_calls_with_one_key_run_once() {
    let probe = Probe::default();
    let server = std::sync::Arc::new(Server::start(router(&probe)).await);
    let key = json!({ "dev.carmy/request_id": "mcp-stampede" });
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(64));
    let calls: Vec<_> = (0..64)
        .map(|id| {
            let (server, barrier, key) = (server.clone(), barrier.clone(), key.clone());
            tokio::spawn(async move {
                let request = call(id, "slow_write", json!({ "millis": 100 }), key);
                barrier.wait().await;
                result(&server.send(request).await)
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    assert_eq!(probe.runs(), 1, "exactly one execution");
    let first = &answers[0];
    assert_eq!(first["isError"], false, "{first}");
    for answer in &answers {
        assert_eq!(answer["structuredContent"], first["structuredContent"]);
        assert_eq!(
            answer["_meta"]["dev.carmy/execution_id"],
            first["_meta"]["dev.carmy/execution_id"]
        );
    }
    let replayed = answers
        .iter()
        .filter(|answer| answer["_meta"]["dev.carmy/replayed"] == true)
        .count();
    assert_eq!(replayed, 63);
}

#[tokio::test]
async fn the_request_id_in_meta_is_the_idempotency_key() {
    let probe = Probe::default();
    let router = router(&probe);
    let key = json!({ "dev.carmy/request_id": "mcp-1" });
    let first = result(
        &send(
            &router,
            call(1, "count", json!({ "text": "a" }), key.clone()),
        )
        .await,
    );
    let again = result(
        &send(
            &router,
            call(2, "count", json!({ "text": "a" }), key.clone()),
        )
        .await,
    );
    assert_eq!(first["structuredContent"], json!({ "run": 1 }));
    assert_eq!(again["structuredContent"], first["structuredContent"]);
    assert_eq!(
        again["_meta"]["dev.carmy/execution_id"],
        first["_meta"]["dev.carmy/execution_id"]
    );
    assert_eq!(
        (
            first["_meta"]["dev.carmy/replayed"].clone(),
            again["_meta"]["dev.carmy/replayed"].clone()
        ),
        (json!(false), json!(true))
    );
    assert_eq!(probe.runs(), 1);

    // The same key over HTTP is the same record: one namespace per caller, whatever the transport.
    let http = carmy_tests::execute(
        &router,
        &json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": "mcp-1" }),
    )
    .await;
    assert_eq!(http.header("carmy-replayed"), Some("true"));

    let conflict = result(&send(&router, call(3, "count", json!({ "text": "b" }), key)).await);
    assert_eq!(conflict["isError"], true);
    assert_eq!(
        conflict["_meta"]["dev.carmy/error"]["code"],
        "IDEMPOTENCY_CONFLICT"
    );

    let malformed = result(
        &send(
            &router,
            call(
                4,
                "count",
                json!({ "text": "c" }),
                json!({ "dev.carmy/request_id": 5 }),
            ),
        )
        .await,
    );
    assert_eq!(malformed["isError"], true);
    assert_eq!(
        malformed["_meta"]["dev.carmy/error"]["code"],
        "INVALID_REQUEST"
    );
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn confirmation_is_granted_only_on_the_server_side() {
    let probe = Probe::default();
    let router = router(&probe);
    // Whatever the request says about itself, the anonymous caller holds no permission.
    let meta = json!({ "permissions": ["confirm:wipe"], "dev.carmy/principal": "admin" });
    let refused = result(&send(&router, call(1, "wipe", json!({}), meta)).await);
    assert_eq!(refused["isError"], true);
    assert_eq!(
        refused["_meta"]["dev.carmy/error"]["code"],
        "CONFIRMATION_REQUIRED"
    );
    assert_eq!(probe.runs(), 0);

    // Host middleware attaches the caller, as for `/agent/execute`.
    let granted = router.layer(axum::middleware::from_fn(
        |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
            request.extensions_mut().insert(
                Principal::new("user-7", TrustLevel::Known).with_permission("confirm:wipe"),
            );
            next.run(request).await
        },
    ));
    let called = result(&send(&granted, call(2, "wipe", json!({}), json!({}))).await);
    assert_eq!(called["structuredContent"]["text"], "wiped by user-7");
}

#[tokio::test]
async fn progress_is_streamed_when_the_client_sends_a_token() {
    let probe = Probe::default();
    let router = router(&probe);
    let meta = json!({ "progressToken": "p-1" });
    let answer = send(
        &router,
        call(5, "slow_read", json!({ "millis": 100 }), meta),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        answer
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let messages: Vec<Value> =
        parse_sse(&String::from_utf8_lossy(&answer.body).replace("\r\n", "\n"))
            .into_iter()
            .filter_map(|event| event.data.filter(|data| !data.is_empty()))
            .map(|data| serde_json::from_str(&data).unwrap())
            .collect();
    let (last, progress) = messages.split_last().unwrap();
    assert_eq!(progress.len(), 10, "{messages:?}");
    for (step, notification) in progress.iter().enumerate() {
        assert_eq!(notification["method"], "notifications/progress");
        assert_eq!(notification["params"]["progressToken"], "p-1");
        assert_eq!(
            notification["params"]["progress"].as_f64(),
            Some(step as f64 + 1.0)
        );
        assert_eq!(notification["params"]["total"].as_f64(), Some(10.0));
    }
    assert_eq!(last["id"], 5);
    assert_eq!(last["result"]["structuredContent"], json!({ "run": 1 }));

    // Without a token, the same call is one JSON answer.
    let answer = send(
        &router,
        call(6, "slow_read", json!({ "millis": 10 }), json!({})),
    )
    .await;
    assert_eq!(answer.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn a_closed_stream_cancels_the_execution() {
    let probe = Probe::default();
    let server = Server::start(router(&probe)).await;
    let key = json!({ "dev.carmy/request_id": "gone-mcp" });
    let request = call(1, "slow_write", json!({ "millis": 1500 }), key.clone());
    probe.leave_once_it_runs(server.addr, request, 1).await;
    tokio::time::timeout(Duration::from_secs(1), probe.saw_cancellation.notified())
        .await
        .expect("the tool sees the cancellation within 1 s");

    // As over HTTP, an interrupted non-idempotent write is uncertain.
    let retry = result(
        &server
            .send(call(2, "slow_write", json!({ "millis": 1500 }), key))
            .await,
    );
    assert_eq!(
        retry["_meta"]["dev.carmy/error"]["code"],
        "EXECUTION_UNCERTAIN"
    );
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn notifications_cancelled_cancels_the_execution_of_a_session() {
    let probe = Probe::default();
    let server = Server::start(router(&probe)).await;
    let session = handshake_over(&server).await;
    let slow = json!({
        "jsonrpc": "2.0", "id": 41, "method": "tools/call",
        "params": { "name": "slow_write", "arguments": { "millis": 1500 } }
    });
    let pending = call_over(&server, post(&slow, &session.headers())).await;
    probe.wait_runs(1).await;
    let cancelled = json!({
        "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": { "requestId": 41, "reason": "the user changed their mind" }
    });
    let answer = server.send(post(&cancelled, &session.headers())).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    tokio::time::timeout(Duration::from_secs(1), probe.saw_cancellation.notified())
        .await
        .expect("the tool sees the cancellation within 1 s");
    // A plain call of a session is answered directly, as JSON: it says it was cancelled
    // (the client, which cancelled it, ignores the answer).
    assert_cancelled(pending, 41).await;
}

/// Sends `request` on a connection of its own, which stays open; the task gives the answer's
/// content type and body.
async fn call_over(
    server: &Server,
    request: Request<Body>,
) -> tokio::task::JoinHandle<(String, Value)> {
    let (mut sender, connection) = server.connect().await;
    tokio::spawn(async move {
        let response = sender.send_request(request).await.expect("response");
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        drop(connection);
        (content_type, serde_json::from_slice(&body).unwrap())
    })
}

/// The call `id` answers in time, as JSON, that it was cancelled.
async fn assert_cancelled(pending: tokio::task::JoinHandle<(String, Value)>, id: u64) {
    let (content_type, answered) = tokio::time::timeout(Duration::from_secs(2), pending)
        .await
        .expect("the call answers")
        .unwrap();
    assert_eq!(content_type, "application/json");
    assert_eq!(answered["id"], id);
    assert_eq!(answered["result"]["isError"], true);
    assert_eq!(
        answered["result"]["_meta"]["dev.carmy/error"]["code"], "CANCELLED",
        "{answered}"
    );
}

/// A `tools/call` of a session (2025-11-25): no `_meta` of the stateless generation.
fn session_call(id: u64, tool: &str, arguments: Value, meta: Value) -> Value {
    let mut call = json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call", "params": { "name": tool }
    });
    call["params"]["arguments"] = arguments;
    call["params"]["_meta"] = meta;
    call
}

#[tokio::test]
async fn a_plain_call_in_a_session_is_answered_as_json_and_the_rest_as_the_sdk_streams() {
    let router = router(&Probe::default());
    let session = handshake(&router).await;
    let echo = |id, meta| session_call(id, "echo", json!({ "text": "a" }), meta);

    let answer = send(&router, post(&echo(1, json!({})), &session.headers())).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let direct = answer.json();
    assert_eq!(direct["id"], 1);
    assert_eq!(
        direct["result"]["structuredContent"],
        json!({ "text": "a" })
    );
    assert_eq!(direct["result"]["_meta"]["dev.carmy/replayed"], false);

    // What needs the SDK streams its one answer as before: a progress token, a version of the
    // call's own, a missing version header. The result is the same.
    let streamed = [
        (
            echo(2, json!({ "progressToken": "p" })),
            session.headers().to_vec(),
        ),
        (
            echo(
                3,
                json!({ "io.modelcontextprotocol/protocolVersion": "2025-11-25" }),
            ),
            session.headers().to_vec(),
        ),
        (
            echo(4, json!({})),
            vec![("mcp-session-id", session.id.as_str())],
        ),
    ];
    for (body, headers) in streamed {
        let answer = send(&router, post(&body, &headers)).await;
        assert_eq!(answer.status, StatusCode::OK, "{body}");
        assert_eq!(answer.header("content-type"), Some("text/event-stream"));
        let reply = sse_reply(&answer.body);
        assert_eq!(reply["id"], body["id"]);
        assert_eq!(
            reply["result"]["structuredContent"],
            direct["result"]["structuredContent"]
        );
    }

    // A client that takes tasks has its calls answered by the SDK, which gives it tasks.
    let opening = json!({
        "jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": { "extensions": { "io.modelcontextprotocol/tasks": {} } },
            "clientInfo": { "name": "carmy-tests", "version": "1" }
        }
    });
    let tasks = session_of(&send(&router, post(&opening, &[])).await);
    let answer = send(&router, post(&echo(5, json!({})), &tasks.headers())).await;
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    assert_eq!(
        sse_reply(&answer.body)["result"]["structuredContent"],
        json!({ "text": "a" })
    );

    // A session that was never opened is not found, as the SDK says.
    let unknown = [
        ("mcp-session-id", "no-such-session"),
        ("mcp-protocol-version", "2025-11-25"),
    ];
    let answer = send(&router, post(&echo(6, json!({})), &unknown)).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.header("content-type"), Some("application/json"));
}

#[tokio::test]
async fn a_call_in_a_session_outlives_its_client_and_ends_with_its_session() {
    let probe = Probe::default();
    // Time for the tool to run three times as long as the test watches it, below.
    let longer = carmy::Config::parse("[tools.slow_write]\ntimeout = \"10s\"\n", |_| None).unwrap();
    let server = Server::start(tools::app(&probe).config(longer).router().unwrap()).await;
    let session = handshake_over(&server).await;

    // The client goes away: the call is not cancelled (MCP asks for notifications/cancelled),
    // and a retry with its key gets the outcome once it is recorded, not a second run.
    let key = json!({ "dev.carmy/request_id": "session-gone" });
    let slow = session_call(1, "slow_write", json!({ "millis": 3000 }), key.clone());
    probe
        .leave_once_it_runs(server.addr, post(&slow, &session.headers()), 1)
        .await;
    // Within 1 s, well before the tool's 3 s end (which ends its token too).
    let cancelled = tokio::time::timeout(Duration::from_secs(1), probe.saw_cancellation.notified());
    assert!(cancelled.await.is_err(), "the call was cancelled");
    // The retry waits for the first call, then replays it.
    let retry = session_call(2, "slow_write", json!({ "millis": 3000 }), key);
    let answer = server.send(post(&retry, &session.headers())).await;
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let retried = answer.json();
    assert_eq!(
        retried["result"]["structuredContent"],
        json!({ "run": 1 }),
        "{retried}"
    );
    assert_eq!(retried["result"]["_meta"]["dev.carmy/replayed"], true);
    assert_eq!(probe.runs(), 1);

    // Deleting the session cancels the call it runs, which answers so; the session is gone.
    let other = handshake_over(&server).await;
    let slow = session_call(3, "slow_write", json!({ "millis": 1500 }), json!({}));
    let pending = call_over(&server, post(&slow, &other.headers())).await;
    probe.wait_runs(2).await;
    let mut delete = Request::delete("/mcp").header("host", "localhost");
    for (name, value) in other.headers() {
        delete = delete.header(name, value);
    }
    let answer = server.send(delete.body(Body::empty()).unwrap()).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    tokio::time::timeout(Duration::from_secs(1), probe.saw_cancellation.notified())
        .await
        .expect("the tool sees the cancellation within 1 s");
    assert_cancelled(pending, 3).await;
    let after = session_call(4, "echo", json!({ "text": "a" }), json!({}));
    let answer = server.send(post(&after, &other.headers())).await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
}

/// A 2025-11-25 session: its id and negotiated version.
struct Session {
    id: String,
}

impl Session {
    fn headers(&self) -> [(&str, &str); 2] {
        [
            ("mcp-session-id", &self.id),
            ("mcp-protocol-version", "2025-11-25"),
        ]
    }
}

fn initialize(version: &str) -> Request<Body> {
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
fn sse_reply(body: &[u8]) -> Value {
    let text = String::from_utf8_lossy(body).replace("\r\n", "\n");
    parse_sse_data(&text).pop().expect("a reply")
}

fn parse_sse_data(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .filter(|data| !data.is_empty())
        .map(|data| serde_json::from_str(data).unwrap())
        .collect()
}

fn session_of(answer: &Answer) -> Session {
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

async fn handshake(router: &axum::Router) -> Session {
    session_of(&send(router, initialize("2025-11-25")).await)
}

async fn handshake_over(server: &Server) -> Session {
    let session = session_of(&server.send(initialize("2025-11-25")).await);
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let answer = server.send(post(&initialized, &session.headers())).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);
    session
}

#[tokio::test]
async fn a_graceful_shutdown_ends_open_session_streams() {
    let probe = Probe::default();
    let app = tools::app(&probe).shutdown_grace(Duration::from_millis(200));
    let mut serving = Serving::start(app).await;
    let addr = serving.addr;
    let session = session_of(&carmy_tests::send_to(addr, initialize("2025-11-25")).await);
    // The session's standalone stream, which stays open for server-sent messages.
    let (mut sender, _connection) = carmy_tests::connect(addr).await;
    let mut stream = Request::get("/mcp")
        .header("host", "localhost")
        .header("accept", "text/event-stream");
    for (name, value) in session.headers() {
        stream = stream.header(name, value);
    }
    let stream = sender
        .send_request(stream.body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(stream.status(), StatusCode::OK);

    // The server stops although a session stream is open.
    serving.stop();
    serving.ended(Duration::from_secs(3)).await;
    drop(stream);
}

/// A call of a session whose client went away goes on (MCP cancels with a notification); a
/// graceful shutdown waits for it as it waits for any execution, within the grace period.
#[tokio::test]
async fn a_graceful_shutdown_waits_for_a_session_call_whose_client_left() {
    let probe = Probe::default();
    let app = tools::app(&probe)
        .shutdown_grace(Duration::from_secs(10))
        .drain_delay(Duration::ZERO);
    let mut serving = Serving::start(app).await;
    let addr = serving.addr;
    let session = session_of(&carmy_tests::send_to(addr, initialize("2025-11-25")).await);
    let initialized = json!({ "jsonrpc": "2.0", "method": "notifications/initialized" });
    let answer = carmy_tests::send_to(addr, post(&initialized, &session.headers())).await;
    assert_eq!(answer.status, StatusCode::ACCEPTED);

    // No `request_id`: nothing is recorded, and only the shutdown's wait lets the call end.
    let slow = session_call(1, "slow_write", json!({ "millis": 800 }), json!({}));
    probe
        .leave_once_it_runs(addr, post(&slow, &session.headers()), 1)
        .await;

    // The server stops within the grace period.
    serving.stop();
    serving.ended(Duration::from_secs(5)).await;
    assert_eq!(
        probe.finished.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the call ran to its end before the server stopped"
    );
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

/// A 2026-07-28 request of a client that takes tasks (the tasks extension), as `who`.
fn with_tasks(id: u64, method: &str, mut params: Value, who: &str) -> Request<Body> {
    params["_meta"]["io.modelcontextprotocol/protocolVersion"] = json!(MODERN);
    params["_meta"]["io.modelcontextprotocol/clientCapabilities"] =
        json!({ "extensions": { "io.modelcontextprotocol/tasks": {} } });
    // `Mcp-Name` carries the tool of a call and the task of `tasks/*`.
    let name = params["name"]
        .as_str()
        .or(params["taskId"].as_str())
        .map(str::to_owned);
    let body = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
    let authorization = format!("Bearer {who}");
    let mut headers = vec![
        ("mcp-protocol-version", MODERN),
        ("mcp-method", method),
        ("authorization", authorization.as_str()),
    ];
    if let Some(name) = &name {
        headers.push(("mcp-name", name));
    }
    post(&body, &headers)
}

/// Polls `tasks/get` until the task leaves `working`; fails the test after [`PATIENCE`].
async fn task_until_done(router: &axum::Router, task_id: &str) -> Value {
    until(PATIENCE, &format!("task {task_id} ends"), async || {
        let answer = send(
            router,
            with_tasks(9, "tasks/get", json!({ "taskId": task_id }), "alice"),
        )
        .await;
        let task = result(&answer);
        (task["status"] != "working").then_some(task)
    })
    .await
}

/// MCP tasks (the 2026-07-28 extension, driven here as the JSON-RPC exchange itself; the
/// official Python SDK drives them in `mcp_clients`) are the executions of protocol.md §9: the
/// same record over HTTP, the same caller scoping, the same cancellation.
#[tokio::test]
async fn a_client_that_takes_tasks_gets_the_execution_as_a_task() {
    let probe = Probe::default();
    let router = crate::executions::app(&probe).router().unwrap();
    let arguments = json!({ "reports": 2, "millis": 200 });
    let started = send(
        &router,
        with_tasks(
            1,
            "tools/call",
            json!({ "name": "chatty", "arguments": arguments }),
            "alice",
        ),
    )
    .await;
    let task = result(&started);
    assert_eq!(task["resultType"], "task", "{task}");
    assert_eq!(task["status"], "working");
    // Kept at least the record ttl (24 h by default), not forever (`null`).
    assert_eq!(task["ttlMs"], 86_400_000, "{task}");
    let task_id = task["taskId"].as_str().unwrap().to_owned();
    assert!(task_id.starts_with("exec_"), "{task_id}");

    // The same execution over HTTP, and nobody else's.
    let lookup = Request::get(format!("/agent/executions/{task_id}"))
        .header("authorization", "Bearer alice")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, lookup).await.status, StatusCode::OK);
    let bobs = send(
        &router,
        with_tasks(2, "tasks/get", json!({ "taskId": task_id }), "bob"),
    )
    .await;
    assert!(bobs.json()["error"].is_object(), "{:?}", bobs.json());

    let done = task_until_done(&router, &task_id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(done["ttlMs"], 86_400_000, "{done}");
    assert_eq!(done["result"]["structuredContent"], json!({ "reports": 2 }));
    assert_eq!(
        done["result"]["_meta"]["dev.carmy/execution_id"],
        json!(task_id)
    );

    // tasks/cancel cancels the execution the task is.
    let started = send(
        &router,
        with_tasks(
            3,
            "tools/call",
            json!({ "name": "slow_write", "arguments": { "millis": 10_000 } }),
            "alice",
        ),
    )
    .await;
    let task_id = result(&started)["taskId"].as_str().unwrap().to_owned();
    probe.wait_runs(1).await;
    let cancel = send(
        &router,
        with_tasks(4, "tasks/cancel", json!({ "taskId": task_id }), "alice"),
    )
    .await;
    result(&cancel);
    tokio::time::timeout(Duration::from_secs(1), probe.saw_cancellation.notified())
        .await
        .expect("the tool sees the cancellation within 1 s");
    assert_eq!(
        task_until_done(&router, &task_id).await["status"],
        "cancelled"
    );
}
