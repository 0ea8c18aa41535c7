//! MCP `tools/call` (feature `mcp`) and the runtime's semantics behind it: structured content or
//! the carmy error, a direct answer that is the SDK's own to the byte (stateless and in a
//! session), the request id in `_meta` as the idempotency key, confirmation granted only on the
//! server side, and progress streamed for a client's token.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::{Principal, TrustLevel};
use carmy_tests::{Server, parse_sse, send};
use serde_json::{Value, json};

use crate::mcp::{
    call, handshake, post, result, router, rpc_error, session_call, session_of, sse_reply,
};
use crate::tools::Probe;

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
