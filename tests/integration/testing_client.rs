//! `carmy::testing::Client`: the same pipeline, in-process, for tool authors.

use carmy::testing::Client;
use carmy::{ExecutionStatus, Principal, TrustLevel};
use serde_json::json;

use crate::tools::{self, Probe};

#[tokio::test]
async fn calls_run_through_the_whole_pipeline() {
    let probe = Probe::default();
    let client = Client::new(tools::app(&probe)).unwrap();

    let answer = client.call("echo", json!({ "text": "hi" })).await;
    assert_eq!(answer.status, ExecutionStatus::Completed);
    assert_eq!(answer.data(), &json!({ "text": "hi" }));

    let invalid = client.call("echo", json!({ "text": 1 })).await;
    assert_eq!(invalid.error_code(), Some("INVALID_ARGUMENTS"));

    let first = client
        .call("count", json!({ "text": "a" }))
        .request_id("t1")
        .await;
    let replay = client
        .call("count", json!({ "text": "a" }))
        .request_id("t1")
        .await;
    assert!(replay.replayed);
    assert_eq!(replay.body, first.body);
    assert_eq!(probe.runs(), 1);

    let bad_id = client
        .call("count", json!({ "text": "a" }))
        .request_id("")
        .await;
    assert_eq!(bad_id.error_code(), Some("INVALID_REQUEST"));
}

#[tokio::test]
async fn calls_can_be_made_as_a_given_principal() {
    let client = Client::new(tools::app(&Probe::default())).unwrap();
    assert_eq!(
        client.call("wipe", json!({})).await.error_code(),
        Some("CONFIRMATION_REQUIRED")
    );
    let operator = Principal::new("operator", TrustLevel::Internal).with_permission("confirm:wipe");
    let answer = client.call("wipe", json!({})).principal(operator).await;
    assert_eq!(answer.data()["text"], "wiped by operator");
}

#[tokio::test]
async fn a_failed_call_shows_its_code_and_message() {
    let client = Client::new(tools::app(&Probe::default())).unwrap();
    let failed = client.call("echo", json!({ "text": 1 })).await;
    let outcome = "failed: INVALID_ARGUMENTS: arguments do not match the input schema";
    assert_eq!(failed.to_string(), outcome);
    assert!(format!("{failed:?}").contains(outcome), "{failed:?}");

    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        failed.data();
    }))
    .expect_err("data() of a failed call panics");
    assert_eq!(
        panic.downcast_ref::<String>().map(String::as_str),
        Some(&*format!("the call has no data: {outcome}"))
    );

    let completed = client.call("echo", json!({ "text": "hi" })).await;
    assert_eq!(completed.to_string(), r#"completed: {"text":"hi"}"#);
}
