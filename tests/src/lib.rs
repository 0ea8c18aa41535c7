//! Helpers for the black-box tests: send a request to a router and read the answer.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

mod proxy;
mod redis_server;

pub use proxy::Proxy;
pub use redis_server::{Certificates, RedisServer, TempDir};

/// An answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: bytes::Bytes,
}

impl Answer {
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
    let response: Response<Body> = router
        .clone()
        .oneshot(request)
        .await
        .expect("routers are infallible");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body reads").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// `method path` without a body, in-process.
pub async fn send_empty(router: &Router, method: Method, path: &str) -> Answer {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .expect("valid request");
    send(router, request).await
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

/// `GET path`.
pub async fn get(router: &Router, path: &str) -> Answer {
    send(
        router,
        Request::get(path)
            .body(Body::empty())
            .expect("valid request"),
    )
    .await
}

/// Hex SHA-256, as carmy's ETags and `tools_version` use.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A router served on a loopback port for the test's lifetime.
#[derive(Debug)]
pub struct Server {
    pub addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Serves `router` on `127.0.0.1` at a free port.
    pub async fn start(router: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("bound address");
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        Server { addr, task }
    }

    /// Opens a fresh HTTP/1.1 connection. Aborting the returned task closes the socket.
    pub async fn connect(
        &self,
    ) -> (
        hyper::client::conn::http1::SendRequest<Body>,
        tokio::task::JoinHandle<()>,
    ) {
        connect(self.addr).await
    }

    /// Sends `request` on a fresh connection and reads the whole answer.
    pub async fn send(&self, request: Request<Body>) -> Answer {
        send_to(self.addr, request).await
    }

    /// `GET path` with extra headers.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut request = Request::get(path).header("host", self.addr.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request.body(Body::empty()).expect("valid request"))
            .await
    }
}

/// Opens a fresh HTTP/1.1 connection to `addr`. Aborting the returned task closes the socket.
pub async fn connect(
    addr: std::net::SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Body>,
    tokio::task::JoinHandle<()>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    (sender, task)
}

/// Sends `request` to `addr` on a fresh connection and reads the whole answer.
pub async fn send_to(addr: std::net::SocketAddr, request: Request<Body>) -> Answer {
    let (mut sender, _connection) = connect(addr).await;
    let response = sender.send_request(request).await.expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One Server-Sent Event, or a comment (a keep-alive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub id: Option<String>,
    pub data: Option<String>,
    pub comment: bool,
}

impl SseEvent {
    /// The data as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().expect("event has data")).expect("data is JSON")
    }
}

/// Splits an event-stream body into its events and comments.
pub fn parse_sse(text: &str) -> Vec<SseEvent> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut event = SseEvent {
                event: None,
                id: None,
                data: None,
                comment: false,
            };
            for line in block.lines() {
                if line.starts_with(':') {
                    event.comment = true;
                } else if let Some((field, value)) = line.split_once(':') {
                    let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
                    match field {
                        "event" => event.event = Some(value),
                        "id" => event.id = Some(value),
                        "data" => {
                            assert!(event.data.is_none(), "data must fit on one line: {block}");
                            event.data = Some(value);
                        }
                        other => panic!("unexpected SSE field {other:?} in {block:?}"),
                    }
                }
            }
            event
        })
        .collect()
}

/// `POST /agent/execute` with a JSON body to a server at `addr`, on a fresh connection.
pub async fn execute_at(addr: std::net::SocketAddr, body: &Value) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(connection);
    let request = Request::post("/agent/execute")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("valid request");
    let response = sender.send_request(request).await.expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// The location of a service some tests need, from `var`: a server's URL, or a client program.
///
/// Unset, the test is skipped and says so on stderr, written directly: libtest hides what a
/// passing test prints with `eprintln!`. With `CARMY_REQUIRE_SERVICES` set, as `.ci/run` sets
/// it, the test fails instead, so CI never skips a test.
pub fn server_url(var: &str) -> Option<String> {
    use std::io::Write as _;
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CARMY_REQUIRE_SERVICES").is_some() => {
            panic!("{var} is not set, and CARMY_REQUIRE_SERVICES forbids skipping")
        }
        _ => {
            // libtest runs each test on a thread named after it.
            let thread = std::thread::current();
            let test = thread.name().unwrap_or("a test");
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED {test}: needs {var} (.ci/run sets it)"
            );
            None
        }
    }
}

/// The example as shipped (`CARMY_SHOP_BIN`, with its `carmy.toml`) on a loopback port, with
/// `envs` set besides; killed when dropped.
#[derive(Debug)]
pub struct ShippedShop {
    child: std::process::Child,
    pub addr: std::net::SocketAddr,
}

impl ShippedShop {
    pub async fn start(program: &std::path::Path, envs: &[(&str, &std::ffi::OsStr)]) -> Self {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap();
        let child = std::process::Command::new(program)
            .env("CARMY_ADDR", addr.to_string())
            .env("RUST_LOG", "warn")
            .env_remove("CARMY_IDEMPOTENCY_URL")
            .env_remove("CARMY_CONFIG")
            .envs(envs.iter().copied())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("{program:?} cannot start: {error}"));
        let shop = ShippedShop { child, addr };
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return shop;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("the shop did not listen on {addr} within 10 s");
    }
}

impl Drop for ShippedShop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

/// Runs an outside program (an MCP client, a fuzzer, the browser test) in `dir` to its end;
/// fails the test with everything it printed unless it succeeds, else prints its output.
pub async fn run_to_success(
    program: impl AsRef<std::ffi::OsStr>,
    args: &[&std::ffi::OsStr],
    dir: &std::path::Path,
) {
    let mut command = std::process::Command::new(program.as_ref());
    command.args(args).current_dir(dir);
    let shown = format!("{command:?}");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the program's thread runs")
        .unwrap_or_else(|error| panic!("{shown} cannot start: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{shown} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    println!("{stdout}");
}
