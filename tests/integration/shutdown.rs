//! `App::serve_with_shutdown`: stop accepting, let executions in flight finish within the
//! grace period, then cancel them.

use std::time::Duration;

use carmy_tests::execute_request;
use serde_json::json;

use crate::tools::{self, Probe};

async fn serve(
    probe: &Probe,
    grace: Duration,
) -> (
    std::net::SocketAddr,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<(), carmy::Error>>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let app = tools::app(probe).shutdown_grace(grace);
    let server = tokio::spawn(app.serve_with_shutdown(listener, async move {
        let _ = stopped.await;
    }));
    (addr, stop, server)
}

async fn call(addr: std::net::SocketAddr, millis: u64) -> carmy_tests::Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = execute_request(
        &json!({ "tool": "slow_write", "arguments": { "millis": millis } }),
        &[],
    );
    let response = sender.send_request(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let body = http_body_util::BodyExt::collect(body)
        .await
        .unwrap()
        .to_bytes();
    carmy_tests::Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

#[tokio::test]
async fn executions_in_flight_finish_within_the_grace_period() {
    let probe = Probe::default();
    let (addr, stop, server) = serve(&probe, Duration::from_secs(5)).await;
    let in_flight = tokio::spawn(call(addr, 300));
    probe.wait_runs(1).await;
    stop.send(()).unwrap();
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["status"], "completed");
    server.await.unwrap().unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn executions_past_the_grace_period_are_cancelled() {
    let probe = Probe::default();
    let (addr, stop, server) = serve(&probe, Duration::from_millis(100)).await;
    let in_flight = tokio::spawn(call(addr, 1_900));
    probe.wait_runs(1).await;
    stop.send(()).unwrap();
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, 408);
    assert_eq!(answer.json()["status"], "cancelled");
    assert_eq!(answer.json()["error"]["code"], "CANCELLED");
    server.await.unwrap().unwrap();
}

/// A client that sent half a request head and stopped: today's shutdown would wait for it.
async fn stalled_client(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(b"POST /agent/execute HTTP/1.1\r\nHost: x\r\nContent-Le")
        .await
        .unwrap();
    stalled
}

#[tokio::test]
async fn a_stalled_client_cannot_hold_the_shutdown() {
    let probe = Probe::default();
    let (addr, stop, server) = serve(&probe, Duration::from_millis(500)).await;
    let _stalled = stalled_client(addr).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = std::time::Instant::now();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the shutdown ends")
        .unwrap()
        .unwrap();
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_millis(2_000),
        "grace 0.5 s + closing margin: {elapsed:?}"
    );
}

#[tokio::test]
async fn executions_drain_while_a_stalled_client_is_closed() {
    let probe = Probe::default();
    let (addr, stop, server) = serve(&probe, Duration::from_millis(1_500)).await;
    let mut stalled = stalled_client(addr).await;
    let in_flight = tokio::spawn(call(addr, 300));
    probe.wait_runs(1).await;
    let start = std::time::Instant::now();
    stop.send(()).unwrap();
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["status"], "completed");
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("the shutdown ends")
        .unwrap()
        .unwrap();
    assert!(start.elapsed() < Duration::from_millis(3_000));
    let closed = crate::connections::closed_after(&mut stalled, Duration::from_millis(100)).await;
    assert!(closed.is_some(), "the stalled connection is closed");
}
