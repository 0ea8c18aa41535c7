//! `Accept: text/event-stream` (protocol.md §4, Streaming).

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy_tests::{Server, SseEvent, execute, execute_request, parse_sse, send};
use serde_json::json;

use crate::tools::{self, Probe};

const STREAM: (&str, &str) = ("accept", "text/event-stream");

fn events_of(answer: &carmy_tests::Answer) -> Vec<SseEvent> {
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("content-type"), Some("text/event-stream"));
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    parse_sse(std::str::from_utf8(&answer.body).unwrap())
}

/// Checks names, sequential ids and the completed event last; returns the events.
fn check_order(events: &[SseEvent]) -> Vec<&SseEvent> {
    let events: Vec<_> = events.iter().filter(|event| !event.comment).collect();
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event.id.as_deref(),
            Some((index + 1).to_string().as_str()),
            "{events:?}"
        );
    }
    assert_eq!(events[0].event.as_deref(), Some("execution.started"));
    assert_eq!(
        events.last().unwrap().event.as_deref(),
        Some("execution.completed")
    );
    for event in &events[1..events.len() - 1] {
        assert_eq!(event.event.as_deref(), Some("tool.progress"));
    }
    events
}

#[tokio::test]
async fn a_stream_starts_reports_progress_and_completes_last() {
    let router = tools::app(&Probe::default()).router().unwrap();
    let request = execute_request(
        &json!({ "tool": "slow_read", "arguments": { "millis": 100 } }),
        &[STREAM],
    );
    let all = events_of(&send(&router, request).await);
    let events = check_order(&all);
    assert_eq!(events.len(), 12);
    let started = events[0].json();
    let execution_id = started["execution_id"].as_str().unwrap();
    assert_eq!(
        started,
        json!({ "execution_id": execution_id, "tool": "slow_read" })
    );
    assert_eq!(
        events[1].data.as_deref().unwrap(),
        format!(
            "{{\"execution_id\":\"{execution_id}\",\"progress\":1,\"total\":10,\"message\":\"step 1\"}}"
        )
    );
    assert_eq!(events[10].json()["progress"], 10);
    let completed = events[11].json();
    assert_eq!(completed["execution_id"], execution_id);
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["data"], json!({ "run": 1 }));
    assert_eq!(
        completed["_agent"],
        json!({ "cacheable": true, "next_actions": [] })
    );
    assert_eq!(completed["replayed"], false);
    let keys: Vec<_> = completed.as_object().unwrap().keys().cloned().collect();
    assert_eq!(
        keys,
        ["execution_id", "status", "data", "_agent", "replayed"]
    );
}

#[tokio::test]
async fn a_replay_streams_the_recorded_answer_marked_replayed() {
    let router = tools::app(&Probe::default()).router().unwrap();
    let call = json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": "s1" });
    let first = execute(&router, &call).await.json();
    let all = events_of(&send(&router, execute_request(&call, &[STREAM])).await);
    let events = check_order(&all);
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].json()["execution_id"], first["execution_id"]);
    let mut completed = events[1].json();
    assert_eq!(completed["replayed"], true);
    completed.as_object_mut().unwrap().remove("replayed");
    assert_eq!(completed, first);
}

#[tokio::test]
async fn failures_after_parsing_are_streamed_too() {
    let router = tools::app(&Probe::default()).router().unwrap();
    let request = execute_request(&json!({ "tool": "count", "arguments": {} }), &[STREAM]);
    let all = events_of(&send(&router, request).await);
    let events = check_order(&all);
    let completed = events.last().unwrap().json();
    assert_eq!(completed["status"], "failed");
    assert_eq!(completed["error"]["code"], "INVALID_ARGUMENTS");
}

#[tokio::test]
async fn a_request_rejected_before_an_execution_gets_json_not_a_stream() {
    let router = tools::app(&Probe::default()).router().unwrap();
    let request = Request::post("/agent/execute")
        .header("content-type", "application/json")
        .header("accept", "text/event-stream")
        .body(Body::from("{\"tool\":"))
        .unwrap();
    let answer = send(&router, request).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.json()["error"]["code"], "INVALID_REQUEST");
}

#[tokio::test]
async fn keep_alive_comments_flow_while_the_tool_is_quiet() {
    let router = shop::app()
        .sse_keep_alive(Duration::from_millis(40))
        .router()
        .unwrap();
    let request = execute_request(
        &json!({ "tool": "generate_report", "arguments": { "seconds": 1 } }),
        &[STREAM],
    );
    let all = events_of(&send(&router, request).await);
    assert!(
        all.iter().filter(|event| event.comment).count() >= 3,
        "{all:?}"
    );
    let events = check_order(&all);
    assert_eq!(events.len(), 1 + 4 + 1);
}

#[tokio::test]
async fn a_stream_over_a_real_socket_arrives_event_by_event() {
    let server = Server::start(shop::app().router().unwrap()).await;
    let (mut sender, _connection) = server.connect().await;
    let request = execute_request(
        &json!({ "tool": "generate_report", "arguments": { "seconds": 1 } }),
        &[STREAM],
    );
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut text = String::new();
    let mut frames = 0;
    while let Some(frame) = http_body_util::BodyExt::frame(&mut body).await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames += 1;
            text.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
    assert!(
        frames >= 6,
        "each event is flushed as it happens ({frames} frames)"
    );
    let all = parse_sse(&text);
    let events = check_order(&all);
    assert_eq!(events.len(), 6);
    assert_eq!(events[5].json()["data"]["seconds"], 1);
}
