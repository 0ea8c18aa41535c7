//! How an MCP call ends (feature `mcp`): cancelled when its stream closes or by
//! `notifications/cancelled`; a session's call outliving a client that left, until its session
//! ends; open sessions through a graceful shutdown; and a task of the 2026-07-28 tasks
//! extension, which is the execution of protocol.md §9.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy_tests::wait::{PATIENCE, until};
use carmy_tests::{Server, Serving, send};
use http_body_util::BodyExt;
use serde_json::{Value, json};

use crate::mcp::{
    MODERN, call, handshake_over, initialize, post, result, router, session_call, session_of,
};
use crate::tools::{self, Probe};

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

#[tokio::test]
async fn a_call_in_a_session_outlives_its_client_and_ends_with_its_session() {
    let probe = Probe::default();
    // Time for the tool to run three times as long as the test watches it, below.
    let longer =
        carmy::config::Config::parse("[tools.slow_write]\ntimeout = \"10s\"\n", |_| None).unwrap();
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
