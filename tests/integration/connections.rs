//! Connections over real loopback sockets: the head deadline (silent, trickling, a stalled
//! HTTP/2 preface), the body deadline, idle connections, the connection cap, and whole server
//! processes (`served`, a binary of this package) under a 1,024 file-descriptor limit and a
//! real SIGTERM.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use carmy_tests::{DISCOVERY, Serving, accepted_so_far, closed_after, parse_answer, raw, try_raw};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};

use crate::tools::{self, Probe};

/// [`raw`], answered within 5 s, its body JSON.
async fn answered_in_time(addr: SocketAddr, request: &[u8]) -> (u16, Value) {
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), raw(addr, request))
        .await
        .expect("answered within 5 s");
    let json = serde_json::from_str(&body).unwrap_or_else(|error| panic!("{error}: {body}"));
    (status, json)
}

#[tokio::test]
async fn a_silent_connection_is_closed_at_the_head_timeout() {
    let app = tools::app(&Probe::default()).head_timeout(Duration::from_secs(1));
    let server = Serving::start(app).await;
    let addr = server.addr;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let closed = closed_after(&mut silent, Duration::from_secs(5)).await;
    let closed = closed.expect("a silent connection is closed");
    assert!(
        closed >= Duration::from_millis(900) && closed < 3 * Duration::from_secs(1),
        "{closed:?}"
    );
}

/// Trickles a request head on `stream`, one byte every 100 ms (each byte would reset a per-read
/// timeout), until the server cuts it; how long that took, from the first byte.
async fn cut_while_trickling_a_head(stream: TcpStream) -> Duration {
    let (mut reader, mut writer) = stream.into_split();
    let start = Instant::now();
    let trickle = tokio::spawn(async move {
        for byte in b"GET /.well-known/agent HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
            if writer.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buffer = [0_u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(5), reader.read(&mut buffer)).await;
    let elapsed = start.elapsed();
    trickle.abort();
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the trickling head is cut without an answer: {read:?}"
    );
    elapsed
}

#[tokio::test]
async fn a_trickled_head_is_cut_at_one_deadline() {
    let app = tools::app(&Probe::default()).head_timeout(Duration::from_secs(1));
    let server = Serving::start(app).await;
    let addr = server.addr;
    let stream = TcpStream::connect(addr).await.unwrap();
    let elapsed = cut_while_trickling_a_head(stream).await;
    assert!(elapsed < 3 * Duration::from_secs(1), "{elapsed:?}");
}

#[tokio::test]
async fn a_stalled_http2_preface_is_cut_at_the_head_timeout() {
    let app = tools::app(&Probe::default()).head_timeout(Duration::from_secs(1));
    let server = Serving::start(app).await;
    let addr = server.addr;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    let closed = closed_after(&mut stream, Duration::from_secs(5)).await;
    let closed = closed.expect("a stalled preface is closed");
    assert!(closed < 3 * Duration::from_secs(1), "{closed:?}");
}

#[tokio::test]
async fn a_stalled_body_is_a_json_408() {
    let app = tools::app(&Probe::default()).body_timeout(Duration::from_secs(1));
    let server = Serving::start(app).await;
    let addr = server.addr;
    let start = Instant::now();
    let (status, body) = answered_in_time(
        addr,
        b"POST /agent/execute HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"tool\":",
    )
    .await;
    assert!(start.elapsed() < 3 * Duration::from_secs(1));
    assert_eq!(status, 408, "{body}");
    assert_eq!(body["error"]["code"], "REQUEST_TIMEOUT");
    assert_eq!(body["error"]["category"], "cancelled");
    assert_eq!(body["error"]["retryable"], true);
}

/// A `Content-Length` over the limit is refused from the head alone: the answer comes at once,
/// with the body never sent and its deadline (the default, 30 s) far off.
#[tokio::test]
async fn a_body_declared_over_the_limit_is_refused_before_it_arrives() {
    let app = tools::app(&Probe::default());
    let server = Serving::start(app).await;
    let addr = server.addr;
    let (status, body) = answered_in_time(
        addr,
        b"POST /agent/execute HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 1048577\r\n\r\n{\"tool\":",
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["error"]["code"], "PAYLOAD_TOO_LARGE");
    assert_eq!(body["error"]["details"]["limit_bytes"], 1024 * 1024);
}

/// The body's deadline runs from the end of the head, whatever the body does meanwhile: a body
/// that keeps arriving, one byte every 100 ms, is cut at the deadline like a silent one.
#[tokio::test]
async fn a_trickling_body_is_cut_at_one_deadline() {
    let app = tools::app(&Probe::default()).body_timeout(Duration::from_secs(1));
    let server = Serving::start(app).await;
    let addr = server.addr;
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut reader, mut writer) = stream.into_split();
    writer
        .write_all(b"POST /agent/execute HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        .await
        .unwrap();
    let start = Instant::now();
    let trickle = tokio::spawn(async move {
        for _ in 0..100 {
            if writer.write_all(b" ").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), reader.read_to_end(&mut answer))
        .await
        .expect("the trickling body is answered")
        .unwrap();
    let elapsed = start.elapsed();
    trickle.abort();
    let (status, body) = parse_answer(&answer);
    assert_eq!(status, 408, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "REQUEST_TIMEOUT");
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < 3 * Duration::from_secs(1),
        "{elapsed:?}"
    );
}

/// Sends one request on `stream` and reads its answer's head (the discovery document fits in
/// one read on loopback).
async fn one_request(stream: &mut TcpStream) {
    stream
        .write_all(b"GET /.well-known/agent HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buffer = [0_u8; 4096];
    let read = stream.read(&mut buffer).await.unwrap();
    assert!(buffer[..read].starts_with(b"HTTP/1.1 200"), "{read}");
}

#[tokio::test]
async fn an_idle_connection_is_closed_at_the_idle_timeout() {
    // A head timeout far past the idle one: a connection closed by the first is not taken for
    // one closed by the second.
    let app = tools::app(&Probe::default())
        .head_timeout(Duration::from_secs(10))
        .idle_timeout(Duration::from_secs(1));
    let server = Serving::start(app).await;
    let addr = server.addr;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    one_request(&mut stream).await;
    let closed = closed_after(&mut stream, Duration::from_secs(5)).await;
    let closed = closed.expect("an idle keep-alive connection is closed");
    assert!(
        closed >= Duration::from_millis(800) && closed < 3 * Duration::from_secs(1),
        "{closed:?}"
    );
}

/// Waiting for its next request, a keep-alive connection is idle: the head timeout starts with
/// the head's first byte, not when the connection goes idle.
#[tokio::test]
async fn a_keep_alive_connection_waits_the_idle_timeout_for_its_next_request() {
    // Idle for longer than the head timeout, and for a third of the idle timeout.
    let idle = Duration::from_secs(5);
    let app = tools::app(&Probe::default())
        .head_timeout(Duration::from_secs(1))
        .idle_timeout(idle);
    let server = Serving::start(app).await;
    let addr = server.addr;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    one_request(&mut stream).await;
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    one_request(&mut stream).await;
    let closed = closed_after(&mut stream, 4 * idle).await;
    let closed = closed.expect("an idle keep-alive connection is closed");
    assert!(
        closed >= idle - Duration::from_millis(200) && closed < 3 * idle,
        "{closed:?}"
    );
}

/// A later head is held to the head timeout from its first byte, like the first one.
#[tokio::test]
async fn a_trickled_second_head_is_cut_at_one_deadline() {
    let app = tools::app(&Probe::default())
        .head_timeout(Duration::from_secs(1))
        .idle_timeout(Duration::from_secs(5));
    let server = Serving::start(app).await;
    let addr = server.addr;
    let mut stream = TcpStream::connect(addr).await.unwrap();
    one_request(&mut stream).await;
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let elapsed = cut_while_trickling_a_head(stream).await;
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < 3 * Duration::from_secs(1),
        "{elapsed:?}"
    );
}

/// A request in flight is never idle: a call, and a stream of its events, longer than the idle
/// timeout (and the head timeout) are answered whole.
#[tokio::test]
async fn calls_and_streams_longer_than_the_idle_timeout_are_answered_whole() {
    let app = tools::app(&Probe::default())
        .head_timeout(Duration::from_secs(1))
        .idle_timeout(Duration::from_secs(1));
    let server = Serving::start(app).await;
    let addr = server.addr;
    let body = r#"{"tool":"slow_read","arguments":{"millis":1500}}"#;
    for accept in ["application/json", "text/event-stream"] {
        let request = format!(
            "POST /agent/execute HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAccept: {accept}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let (status, answer) = raw(addr, request.as_bytes()).await;
        assert_eq!(status, 200, "{accept}: {answer}");
        assert!(
            answer.contains(r#""status":"completed""#),
            "{accept}: {answer}"
        );
    }
}

#[tokio::test]
async fn at_the_connection_cap_a_client_waits_at_most_the_head_timeout() {
    let app = tools::app(&Probe::default())
        .head_timeout(Duration::from_secs(1))
        .max_connections(50);
    let server = Serving::start(app).await;
    let addr = server.addr;
    // The listener takes connections in the order they came: the 51st waits until a silent
    // one, taken after `start`, times out.
    let start = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..50 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), raw(addr, DISCOVERY))
        .await
        .expect("the client is served once the silent connections time out");
    let waited = start.elapsed();
    assert_eq!(status, 200);
    assert!(
        waited >= Duration::from_millis(900) && waited < 3 * Duration::from_secs(1),
        "the 51st connection waits for a slot, at most the head timeout: {waited:?}"
    );
}

/// A `served` process; killed when dropped.
struct Served {
    addr: SocketAddr,
    child: Child,
}

impl Served {
    /// Starts `served` with `args` and `CARMY_*` settings, under `ulimit -n` when given, and
    /// waits until it answers.
    async fn start(args: &[&str], env: &[(&str, &str)], fd_limit: Option<u32>) -> Served {
        let addr = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap()
        };
        let program = env!("CARGO_BIN_EXE_served");
        let mut command = match fd_limit {
            Some(limit) => {
                let mut command = Command::new("sh");
                command
                    .arg("-c")
                    .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                    .arg(program);
                command
            }
            None => Command::new(program),
        };
        command
            .args(args)
            .env("SERVED_ADDR", addr.to_string())
            .env_remove("CARMY_CONFIG")
            .env("RUST_LOG", "info")
            .current_dir(std::env::temp_dir())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = command.spawn().expect("the served binary starts");
        let mut served = Served { addr, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Ok((200, _))) =
                tokio::time::timeout(Duration::from_secs(1), try_raw(addr, DISCOVERY)).await
            {
                return served;
            }
            if let Ok(Some(status)) = served.child.try_wait() {
                panic!("served exited before answering: {status}");
            }
            assert!(Instant::now() < deadline, "served never answered");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends SIGTERM.
    async fn terminate(&self) {
        let pid = self.child.id().expect("running").to_string();
        let status = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .await
            .unwrap();
        assert!(status.success());
    }

    /// Waits for the process to exit, up to `limit`; returns its stderr.
    async fn exit(mut self, limit: Duration) -> Result<String, String> {
        let mut stderr = self.child.stderr.take().expect("piped stderr");
        let exited = tokio::time::timeout(limit, self.child.wait()).await;
        let mut logs = String::new();
        if exited.is_err() {
            self.child.kill().await.unwrap();
        }
        stderr.read_to_string(&mut logs).await.unwrap();
        match exited {
            Ok(Ok(status)) if status.success() => Ok(logs),
            _ => Err(logs),
        }
    }
}

#[tokio::test]
async fn app_serve_serves_http_whatever_the_arguments_and_logs_its_tools() {
    // `program mcp`: stdio is the program's own decision, never `App::serve`'s.
    let served = Served::start(&["mcp"], &[], None).await;
    let (status, body) = raw(served.addr, DISCOVERY).await;
    assert_eq!(status, 200, "{body}");
    served.terminate().await;
    let logs = served.exit(Duration::from_secs(15)).await.unwrap();
    assert!(
        logs.contains("serving 1 tool\n") || logs.contains("serving 1 tool "),
        "{logs}"
    );
    assert!(logs.contains("tools=1"), "{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "no ANSI codes when stderr is not a terminal: {logs:?}"
    );
}

#[tokio::test]
async fn silent_connections_cannot_lock_out_clients_at_1024_file_descriptors() {
    let served = Served::start(
        &[],
        &[
            ("CARMY_SERVER_HEAD_TIMEOUT_SECS", "1"),
            ("RUST_LOG", "warn"),
        ],
        Some(1024),
    )
    .await;
    let mut silent = Vec::new();
    for _ in 0..1_100 {
        silent.push(TcpStream::connect(served.addr).await.unwrap());
    }
    let start = Instant::now();
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), raw(served.addr, DISCOVERY))
        .await
        .expect("a well-behaved client is served despite 1,100 silent connections");
    let waited = start.elapsed();
    assert_eq!(status, 200);
    assert!(
        waited < 3 * Duration::from_secs(1),
        "served within the head timeout and a margin: {waited:?}"
    );
    drop(silent);
}

#[tokio::test]
async fn sigterm_ends_the_process_despite_a_stalled_client() {
    let served = Served::start(&[], &[("CARMY_SERVER_SHUTDOWN_GRACE_SECS", "1")], None).await;
    let mut stalled = TcpStream::connect(served.addr).await.unwrap();
    stalled
        .write_all(b"POST /agent/execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        .await
        .unwrap();
    accepted_so_far(served.addr).await;
    let start = Instant::now();
    served.terminate().await;
    let logs = served.exit(Duration::from_secs(10)).await;
    let elapsed = start.elapsed();
    assert!(logs.is_ok(), "exits cleanly: {logs:?}");
    assert!(
        elapsed < Duration::from_millis(3_000),
        "grace 1 s + closing margin: {elapsed:?}"
    );
}

#[tokio::test]
async fn app_serve_answers_every_unknown_path_with_json_but_hyper_answers_bad_heads_bare() {
    let server = Serving::start(tools::app(&Probe::default())).await;
    let addr = server.addr;
    let (status, body) = raw(
        addr,
        b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 404);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["error"]["code"], "ROUTE_NOT_FOUND");
    // Behind the gate like every carmy answer: it carries the protocol version.
    let request = axum::http::Request::get("/nope")
        .body(axum::body::Body::empty())
        .unwrap();
    let missing = carmy_tests::send_to(addr, request).await;
    assert_eq!(missing.header("carmy-version"), Some("1.0"));
    // The documented exceptions: hyper's parser answers these itself, without a body.
    let mut too_many_headers = b"GET / HTTP/1.1\r\n".to_vec();
    for index in 0..101 {
        too_many_headers.extend_from_slice(format!("X-{index}: 1\r\n").as_bytes());
    }
    too_many_headers.extend_from_slice(b"\r\n");
    let mut long_uri = b"GET /".to_vec();
    long_uri.extend_from_slice(&[b'a'; 70_000]);
    long_uri.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n\r\n");
    for (request, expected) in [
        (too_many_headers, 431),
        (long_uri, 414),
        (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n".to_vec(), 400),
    ] {
        assert_eq!(raw(addr, &request).await, (expected, String::new()));
    }
}
