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
