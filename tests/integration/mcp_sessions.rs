//! MCP sessions (the `initialize`/`Mcp-Session-Id` generation) are bounded and belong to the
//! caller that opened them: a cap per caller (a token's id, an anonymous caller's address) and
//! one in all, answered with a JSON-RPC error; ended sessions free their place; a request
//! naming another caller's session is answered as for one that does not exist, and does
//! nothing.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::TrustLevel;
use carmy::auth::{TokenAuthenticator, hash_token};
use carmy_tests::wait::until;
use carmy_tests::{Answer, Server, send};
use serde_json::{Value, json};

use crate::tools::{self, Probe};

const SESSION_VERSION: &str = "2025-11-25";

/// An app whose tokens `a`, `b` and `c` are callers of those ids, known.
fn app(probe: &Probe) -> carmy::App {
    let tokens = ["a", "b", "c"]
        .into_iter()
        .try_fold(TokenAuthenticator::new(), |tokens, id| {
            tokens.token(
                &hash_token(&format!("{id}-token")),
                carmy::Principal::new(id, TrustLevel::Known),
            )
        })
        .unwrap();
    tools::app(probe).authenticator(tokens)
}

/// A `/mcp` request with the usual headers, as caller `who` (a token's id, or `None`).
fn request(method: &str, body: Option<&Value>, who: Option<&str>) -> Request<Body> {
    let mut request = Request::builder()
        .method(method)
        .uri("/mcp")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(who) = who {
        request = request.header("authorization", format!("Bearer {who}-token"));
    }
    let body = body.map_or_else(Body::empty, |body| Body::from(body.to_string()));
    request.body(body).unwrap()
}

/// The same request in session `id`.
fn in_session(mut request: Request<Body>, id: &str) -> Request<Body> {
    let headers = request.headers_mut();
    headers.insert("mcp-session-id", id.parse().unwrap());
    headers.insert("mcp-protocol-version", SESSION_VERSION.parse().unwrap());
    request
}

fn initialize(id: u64) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "initialize",
        "params": {
            "protocolVersion": SESSION_VERSION,
            "capabilities": {},
            "clientInfo": { "name": "carmy-tests", "version": "1" }
        }
    })
}

fn call(id: u64, tool: &str, arguments: &Value) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": { "name": tool, "arguments": arguments }
    })
}

/// Opens a session as `who`; its id, or the refusal.
async fn open(router: &axum::Router, who: Option<&str>) -> Result<String, Answer> {
    open_with(router, request("POST", Some(&initialize(0)), who)).await
}

async fn open_with(router: &axum::Router, request: Request<Body>) -> Result<String, Answer> {
    let answer = send(router, request).await;
    match answer.header("mcp-session-id") {
        Some(id) if answer.status == StatusCode::OK => Ok(id.to_owned()),
        _ => Err(answer),
    }
}

/// The JSON-RPC error of a refused `initialize` over a cap.
fn over_cap(answer: &Answer, scope: &str, limit: u64) {
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("mcp-session-id"), None);
    let body = answer.json();
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["id"], 0, "the initialize's own id");
    assert_eq!(body["error"]["code"], -32600);
    let data = &body["error"]["data"];
    assert_eq!(data["code"], "MCP_SESSION_LIMIT");
    assert_eq!(data["category"], "capacity");
    assert_eq!(data["retryable"], true);
    assert_eq!(data["details"], json!({ "scope": scope, "limit": limit }));
}

async fn delete(router: &axum::Router, id: &str, who: Option<&str>) -> Answer {
    send(router, in_session(request("DELETE", None, who), id)).await
}

#[tokio::test]
async fn initialize_is_capped_per_caller_and_in_all() {
    let router = app(&Probe::default())
        .mcp_sessions_per_caller(3)
        .mcp_max_sessions(5)
        .router()
        .unwrap();
    let mut of_a = Vec::new();
    for _ in 0..3 {
        of_a.push(open(&router, Some("a")).await.unwrap());
    }
    over_cap(&open(&router, Some("a")).await.unwrap_err(), "caller", 3);
    // Others still may, up to the server's cap.
    open(&router, Some("b")).await.unwrap();
    open(&router, None).await.unwrap();
    over_cap(&open(&router, Some("c")).await.unwrap_err(), "server", 5);
    // The caps are on sessions only: a stateless call goes on.
    let stateless = crate::mcp::call(1, "echo", json!({ "text": "x" }), json!({}));
    let answer = send(&router, with_token(stateless, "c")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["result"]["isError"], false);

    // An ended session frees its place, for its caller and for the server.
    assert_eq!(
        delete(&router, &of_a[0], Some("a")).await.status,
        StatusCode::ACCEPTED
    );
    open(&router, Some("c")).await.unwrap();
    over_cap(&open(&router, Some("a")).await.unwrap_err(), "server", 5);
}

fn with_token(mut request: Request<Body>, who: &str) -> Request<Body> {
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {who}-token").parse().unwrap(),
    );
    request
}

/// Anonymous callers are counted by the address they connect from (here the one a trusted
/// proxy names): one address at its cap leaves the others theirs.
#[tokio::test]
async fn anonymous_callers_are_capped_per_address() {
    let config = carmy::config::Config::parse("trust_forwarded_for = true\n", |_| None).unwrap();
    let router = tools::app(&Probe::default())
        .config(config)
        .mcp_sessions_per_caller(2)
        .router()
        .unwrap();
    let from = |address: &str| {
        let mut request = request("POST", Some(&initialize(0)), None);
        request
            .headers_mut()
            .insert("x-forwarded-for", address.parse().unwrap());
        request
    };
    let first = open_with(&router, from("10.0.0.1")).await.unwrap();
    open_with(&router, from("10.0.0.1")).await.unwrap();
    over_cap(
        &open_with(&router, from("10.0.0.1")).await.unwrap_err(),
        "caller",
        2,
    );
    open_with(&router, from("10.0.0.2")).await.unwrap();
    // An anonymous session is its address's: another address is told it does not exist.
    let mut foreign = in_session(request("DELETE", None, None), &first);
    foreign
        .headers_mut()
        .insert("x-forwarded-for", "10.0.0.2".parse().unwrap());
    assert_eq!(send(&router, foreign).await.status, StatusCode::NOT_FOUND);
}

/// Every way of naming a session — a call answered directly, a request the SDK answers, the
/// standalone stream, `DELETE` — is answered to another caller exactly as for a session that
/// does not exist, and does nothing: the owner's call in progress ends with its result, and the
/// session goes on.
#[tokio::test]
async fn a_session_is_its_openers_alone() {
    let probe = Probe::default();
    let server = Server::start(app(&probe).router().unwrap()).await;
    let router = app(&probe).router().unwrap();
    let mine = open(&router, Some("a")).await.unwrap();

    let list = json!({ "jsonrpc": "2.0", "id": 2, "method": "tools/list" });
    let echo = call(3, "echo", &json!({ "text": "x" }));
    let unknown = send(
        &router,
        in_session(request("POST", Some(&echo), Some("b")), "none"),
    )
    .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    for who in [Some("b"), None] {
        for (method, body) in [
            ("POST", Some(&echo)),
            ("POST", Some(&list)),
            ("GET", None),
            ("DELETE", None),
        ] {
            let answer = send(&router, in_session(request(method, body, who), &mine)).await;
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} as {who:?}");
            assert_eq!(answer.body, unknown.body, "{method} as {who:?}");
            assert_eq!(
                answer.header("content-type"),
                unknown.header("content-type")
            );
        }
    }
    // A DELETE of a session that does not exist is not found either, rather than accepted.
    let gone = delete(&router, "no-such-session", Some("a")).await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    assert_eq!(gone.body, unknown.body);
    let answer = send(
        &router,
        in_session(request("POST", Some(&echo), Some("a")), &mine),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.json()["result"]["structuredContent"],
        json!({ "text": "x" })
    );

    // Over sockets: the owner's slow call runs while another caller tries to end the session.
    let session = open_over(&server, "a").await;
    let slow = call(4, "slow_write", &json!({ "millis": 600 }));
    let pending = {
        let request = in_session(request("POST", Some(&slow), Some("a")), &session);
        let addr = server.addr;
        tokio::spawn(async move { carmy_tests::send_to(addr, request).await })
    };
    probe.wait_runs(1).await;
    let refused = server
        .send(in_session(request("DELETE", None, Some("b")), &session))
        .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    let finished = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the owner's call is answered within 5 s")
        .unwrap();
    assert_eq!(finished.status, StatusCode::OK);
    assert_eq!(
        finished.json()["result"]["structuredContent"],
        json!({ "run": 1 }),
        "{}",
        finished.json()
    );
    assert_eq!(
        probe.finished.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the call ran to its end"
    );
    let again = server
        .send(in_session(
            request("POST", Some(&echo), Some("a")),
            &session,
        ))
        .await;
    assert_eq!(again.status, StatusCode::OK, "the session goes on");
}

async fn open_over(server: &Server, who: &str) -> String {
    let answer = server
        .send(request("POST", Some(&initialize(0)), Some(who)))
        .await;
    assert_eq!(answer.status, StatusCode::OK);
    answer.header("mcp-session-id").unwrap().to_owned()
}

/// A session that goes idle past its timeout ends: its id is unknown from then on, and its
/// place is free again.
#[tokio::test]
async fn an_idle_session_ends_and_frees_its_place() {
    let router = app(&Probe::default())
        .mcp_sessions_per_caller(2)
        .mcp_session_idle_timeout(Duration::from_millis(300))
        .router()
        .unwrap();
    let first = open(&router, Some("a")).await.unwrap();
    open(&router, Some("a")).await.unwrap();
    over_cap(&open(&router, Some("a")).await.unwrap_err(), "caller", 2);
    let freed = "a place freed within 5 s of a 300 ms idle timeout";
    let reopened = until(Duration::from_secs(5), freed, async || {
        match open(&router, Some("a")).await {
            Ok(id) => Some(id),
            Err(refused) => {
                over_cap(&refused, "caller", 2);
                None
            }
        }
    })
    .await;
    let echo = call(1, "echo", &json!({ "text": "x" }));
    let ended = send(
        &router,
        in_session(request("POST", Some(&echo), Some("a")), &first),
    )
    .await;
    assert_eq!(ended.status, StatusCode::NOT_FOUND);
    let live = send(
        &router,
        in_session(request("POST", Some(&echo), Some("a")), &reopened),
    )
    .await;
    assert_eq!(live.status, StatusCode::OK);
}
