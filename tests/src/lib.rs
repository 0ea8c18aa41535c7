//! Helpers for the black-box tests, shared by every test file: requests to a router and their
//! answers, servers on loopback sockets, waits with deadlines, captured logs, the services a
//! test needs, and snapshots.

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

mod by_hand;
mod logs;
pub mod postgres;
mod process;
mod proxy;
mod redis_server;
mod server;
mod services;
mod snapshot;
mod sse;
pub mod wait;

pub use by_hand::{DISCOVERY, accepted_so_far, closed_after, parse_answer, raw, try_raw};
pub use logs::Captured;
pub use process::{ShippedShop, run_to_success};
pub use proxy::{Proxy, split_authority};
pub use redis_server::{Certificates, RedisServer, TempDir, redis_database};
pub use server::{Server, Serving, connect, execute_at, send_to};
pub use services::{needs, server_url};
pub use snapshot::assert_snapshot;
pub use sse::{SseEvent, parse_sse};

/// An answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: bytes::Bytes,
}

impl Answer {
    /// Reads `response` to its end.
    pub async fn read<B>(response: Response<B>) -> Self
    where
        B: HttpBody,
        B::Error: std::fmt::Debug,
    {
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("the body reads").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// The body as JSON; panics (failing the test) if it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "body is not JSON ({error}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// Sends `request` to `router` in-process.
pub async fn send(router: &Router, request: Request<Body>) -> Answer {
    let response = router
        .clone()
        .oneshot(request)
        .await
        .expect("routers are infallible");
    Answer::read(response).await
}

/// `method path` without a body, in-process.
pub async fn send_empty(router: &Router, method: Method, path: &str) -> Answer {
    send(router, request(method.as_str(), path, &[])).await
}

/// `method path` with `headers` and no body.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).expect("valid request")
}

/// The `Authorization` value that presents `token`.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// `method path` as the caller of `token` (anonymous when `None`), with `body` as JSON when
/// given.
pub fn request_as(
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Request<Body> {
    let mut request = Request::builder().method(method).uri(path);
    if let Some(token) = token {
        request = request.header("authorization", bearer(token));
    }
    let body = match body {
        Some(body) => {
            request = request.header("content-type", "application/json");
            Body::from(body.to_string())
        }
        None => Body::empty(),
    };
    request.body(body).expect("valid request")
}

/// [`request_as`], sent to `router` in-process.
pub async fn send_as(
    router: &Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Answer {
    send(router, request_as(method, path, token, body)).await
}

/// `POST /agent/execute` with a JSON body and extra headers.
pub fn execute_request(body: &Value, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::post("/agent/execute").header("content-type", "application/json");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(Body::from(body.to_string()))
        .expect("valid request")
}

/// `POST /agent/execute` in-process.
pub async fn execute(router: &Router, body: &Value) -> Answer {
    send(router, execute_request(body, &[])).await
}

/// `POST /agent/execute` in-process as the caller of `token` (anonymous when `None`).
pub async fn execute_as(router: &Router, body: &Value, token: Option<&str>) -> Answer {
    send_as(router, "POST", "/agent/execute", token, Some(body)).await
}

/// `GET path`.
pub async fn get(router: &Router, path: &str) -> Answer {
    get_with(router, path, &[]).await
}

/// `GET path` with extra headers.
pub async fn get_with(router: &Router, path: &str, headers: &[(&str, &str)]) -> Answer {
    send(router, request("GET", path, headers)).await
}

/// `GET path` as the caller of `token` (anonymous when `None`).
pub async fn get_as(router: &Router, path: &str, token: Option<&str>) -> Answer {
    send_as(router, "GET", path, token, None).await
}

/// Hex SHA-256, as carmy's ETags and `tools_version` use.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Runs the test `name` of the running test binary alone, in a child process, with `set` set
/// and `unset` removed from its environment: what `cargo test` prints of it, and how it ended.
pub fn run_alone(name: &str, set: &[(&str, &str)], unset: &[&str]) -> std::process::Output {
    let mut command = std::process::Command::new(std::env::current_exe().expect("the test binary"));
    command.args(["--exact", name]);
    for var in unset {
        command.env_remove(var);
    }
    command.envs(set.iter().copied());
    command.output().expect("the test binary runs")
}

/// A name unique to this test run, so reruns and parallel tests never share records.
pub fn run_id() -> &'static str {
    static RUN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    RUN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        format!("run{}x{nanos}", std::process::id())
    })
}
