//! A client that goes away cancels its execution, and the outcome follows the idempotency
//! table. Real loopback sockets: the disconnect happens on the socket.

use std::time::Duration;

use carmy_tests::{Server, execute_request};
use serde_json::json;

use crate::tools::{self, Probe};

async fn disconnect_mid_call(
    server: &Server,
    probe: &Probe,
    call: &serde_json::Value,
    stream: bool,
) {
    let headers: &[(&str, &str)] = if stream {
        &[("accept", "text/event-stream")]
    } else {
        &[]
    };
    // The client goes away once the tool runs: the socket closes.
    probe
        .leave_once_it_runs(server.addr, execute_request(call, headers), 1)
        .await;
    tokio::time::timeout(Duration::from_secs(1), probe.saw_cancellation.notified())
        .await
        .expect("the tool sees the cancellation within 1 s");
}

#[tokio::test]
async fn a_json_client_that_disconnects_cancels_the_write_which_is_then_uncertain() {
    let probe = Probe::default();
    let server = Server::start(tools::app(&probe).router().unwrap()).await;
    let call =
        json!({ "tool": "slow_write", "arguments": { "millis": 1500 }, "request_id": "gone-1" });
    disconnect_mid_call(&server, &probe, &call, false).await;

    let retry = server.send(execute_request(&call, &[])).await;
    assert_eq!(retry.status, 409);
    assert_eq!(retry.json()["error"]["code"], "EXECUTION_UNCERTAIN");
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn a_stream_client_that_disconnects_cancels_the_read_which_may_run_again() {
    let probe = Probe::default();
    let server = Server::start(tools::app(&probe).router().unwrap()).await;
    let call =
        json!({ "tool": "slow_read", "arguments": { "millis": 1500 }, "request_id": "gone-2" });
    disconnect_mid_call(&server, &probe, &call, true).await;

    let call =
        json!({ "tool": "slow_read", "arguments": { "millis": 10 }, "request_id": "gone-3" });
    let fresh = server.send(execute_request(&call, &[])).await;
    assert_eq!(fresh.status, 200);
    let call =
        json!({ "tool": "slow_read", "arguments": { "millis": 1500 }, "request_id": "gone-2" });
    let again = server.send(execute_request(&call, &[])).await;
    assert_eq!(
        again.status,
        200,
        "nothing was kept: {}",
        String::from_utf8_lossy(&again.body)
    );
    assert!(again.header("carmy-replayed").is_none());
    assert_eq!(probe.runs(), 3);
}

#[tokio::test]
async fn a_call_without_request_id_is_cancelled_too_and_records_nothing() {
    let probe = Probe::default();
    let server = Server::start(tools::app(&probe).router().unwrap()).await;
    let call = json!({ "tool": "slow_write", "arguments": { "millis": 1500 } });
    disconnect_mid_call(&server, &probe, &call, false).await;
    let again = server.send(execute_request(&call, &[])).await;
    assert_eq!(again.status, 200);
    assert_eq!(probe.runs(), 2);
}
