//! `App::serve_with_shutdown`: stop accepting, let executions in flight finish within the
//! grace period, then cancel them.

use std::time::Duration;

use carmy_tests::wait::{PATIENCE, within};
use carmy_tests::{Serving, accepted_so_far};
use serde_json::json;

use crate::tools::{self, Probe};

async fn serve(probe: &Probe, grace: Duration) -> Serving {
    Serving::start(tools::app(probe).shutdown_grace(grace)).await
}

async fn call(addr: std::net::SocketAddr, millis: u64) -> carmy_tests::Answer {
    let call = json!({ "tool": "slow_write", "arguments": { "millis": millis } });
    carmy_tests::execute_at(addr, &call).await
}

#[tokio::test]
async fn executions_in_flight_finish_within_the_grace_period() {
    let probe = Probe::default();
    let mut server = serve(&probe, Duration::from_secs(5)).await;
    let addr = server.addr;
    let in_flight = tokio::spawn(call(addr, 300));
    probe.wait_runs(1).await;
    server.stop();
    let answer = within(PATIENCE, "the call in flight answers", in_flight)
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["status"], "completed");
    server.ended(PATIENCE).await;
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}

#[tokio::test]
async fn executions_past_the_grace_period_are_cancelled() {
    let probe = Probe::default();
    let mut server = serve(&probe, Duration::from_millis(100)).await;
    let in_flight = tokio::spawn(call(server.addr, 1_900));
    probe.wait_runs(1).await;
    server.stop();
    let answer = within(PATIENCE, "the call in flight answers", in_flight)
        .await
        .unwrap();
    assert_eq!(answer.status, 408);
    assert_eq!(answer.json()["status"], "cancelled");
    assert_eq!(answer.json()["error"]["code"], "CANCELLED");
    server.ended(PATIENCE).await;
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
    let mut server = serve(&probe, Duration::from_millis(500)).await;
    let _stalled = stalled_client(server.addr).await;
    accepted_so_far(server.addr).await;
    let start = std::time::Instant::now();
    server.stop();
    server.ended(Duration::from_secs(5)).await;
    let elapsed = start.elapsed();
    assert!(
        elapsed < Duration::from_millis(2_000),
        "grace 0.5 s + closing margin: {elapsed:?}"
    );
}

#[tokio::test]
async fn executions_drain_while_a_stalled_client_is_closed() {
    let probe = Probe::default();
    let mut server = serve(&probe, Duration::from_millis(1_500)).await;
    let mut stalled = stalled_client(server.addr).await;
    let in_flight = tokio::spawn(call(server.addr, 300));
    probe.wait_runs(1).await;
    let start = std::time::Instant::now();
    server.stop();
    let answer = within(PATIENCE, "the call in flight answers", in_flight)
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["status"], "completed");
    server.ended(Duration::from_secs(5)).await;
    assert!(start.elapsed() < Duration::from_millis(3_000));
    let closed = carmy_tests::closed_after(&mut stalled, Duration::from_millis(100)).await;
    assert!(closed.is_some(), "the stalled connection is closed");
}
