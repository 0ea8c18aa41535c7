//! Spans per the OpenTelemetry conventions: each HTTP request a server span (`POST
//! /agent/execute`) in the caller's trace (`traceparent`), each execution an `execute_tool
//! {tool}` span with its ids, tool, effect, status, duration and error code, and never the
//! arguments or the output; each MCP `tools/call` a `tools/call {tool}` span in the trace its
//! `_meta` names.
//!
//! One test, one subscriber: `tracing` caches which callsites are enabled across threads, and a
//! callsite first hit by another test while this subscriber is being set can be cached as
//! disabled; the cache is rebuilt (`Captured::clear`) before each case.

use axum::body::Body;
use axum::http::Request;
use carmy_tests::{Captured, execute, execute_request, send};
use serde_json::json;

use crate::tools::{self, Probe};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "current_thread")]
async fn spans_follow_the_semantic_conventions() {
    let recorder = Captured::default();
    let _default = recorder.set_default(tracing::Level::TRACE);
    let router = tools::app(&Probe::default()).router().unwrap();
    recorder.clear();
    one_span_per_execution_without_arguments_or_outputs(&recorder, &router).await;
    recorder.clear();
    the_callers_traceparent_is_the_parent_of_the_request(&recorder, &router).await;
    for headers in [
        vec![(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        )],
        vec![("traceparent", TRACEPARENT), ("traceparent", TRACEPARENT)],
    ] {
        recorder.clear();
        a_malformed_or_repeated_traceparent_starts_a_new_trace(&recorder, &router, &headers).await;
    }
    recorder.clear();
    unmatched_paths_name_no_route(&recorder, &router).await;
    recorder.clear();
    mcp_tools_call_is_a_span_in_the_trace_of_its_meta(&recorder, &router).await;
}

async fn one_span_per_execution_without_arguments_or_outputs(
    recorder: &Captured,
    router: &axum::Router,
) {
    let answer = execute(router, &json!({ "tool": "echo", "arguments": { "text": "s3cret-argument" }, "request_id": "trace-1" })).await;
    assert_eq!(answer.json()["data"]["text"], "s3cret-argument");
    execute(router, &json!({ "tool": "refuse" })).await;

    let lines = recorder.text();
    assert!(
        !lines.contains("s3cret"),
        "arguments and outputs stay out of traces:\n{lines}"
    );
    let execution_id = answer.json()["execution_id"].as_str().unwrap().to_owned();
    assert!(lines.contains(&format!(
        "new execute_tool parent=http.server.request otel.name=\"execute_tool echo\" otel.kind=\"internal\" \
         gen_ai.operation.name=\"execute_tool\" gen_ai.tool.name=\"echo\" gen_ai.tool.call.id=\"{execution_id}\" \
         execution_id=\"{execution_id}\" request_id=\"trace-1\""
    )), "{lines}");
    for field in [
        "effect=\"none\"",
        "status=\"completed\"",
        "duration_ms=",
        "status=\"failed\"",
        "error_code=\"OUT_OF_STOCK\"",
        "http.response.status_code=200",
    ] {
        assert!(lines.contains(field), "{field} missing:\n{lines}");
    }
}

async fn the_callers_traceparent_is_the_parent_of_the_request(
    recorder: &Captured,
    router: &axum::Router,
) {
    let body = json!({ "tool": "echo", "arguments": { "text": "hi" } });
    send(
        router,
        execute_request(&body, &[("traceparent", TRACEPARENT)]),
    )
    .await;
    assert_eq!(
        recorder.opened("http.server.request"),
        "new http.server.request parent=none otel.name=\"POST /agent/execute\" otel.kind=\"server\" \
         http.request.method=\"POST\" http.route=\"/agent/execute\" \
         trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\" parent_id=\"00f067aa0ba902b7\""
    );
    assert!(
        recorder
            .opened("execute_tool")
            .contains("parent=http.server.request")
    );
}

async fn a_malformed_or_repeated_traceparent_starts_a_new_trace(
    recorder: &Captured,
    router: &axum::Router,
    headers: &[(&str, &str)],
) {
    let body = json!({ "tool": "echo", "arguments": { "text": "hi" } });
    let answer = send(router, execute_request(&body, headers)).await;
    assert_eq!(answer.status, 200);
    let opened = recorder.opened("http.server.request");
    assert!(!opened.contains("trace_id"), "{opened}");
}

async fn unmatched_paths_name_no_route(recorder: &Captured, router: &axum::Router) {
    let request = Request::get("/agent/no/such/route-8731")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(router, request).await.status, 404);
    let opened = recorder.opened("http.server.request");
    assert!(opened.contains("http.route=\"/agent/{*rest}\""), "{opened}");
    assert!(
        !recorder.text().contains("route-8731"),
        "{}",
        recorder.text()
    );
}

async fn mcp_tools_call_is_a_span_in_the_trace_of_its_meta(
    recorder: &Captured,
    router: &axum::Router,
) {
    let request = crate::mcp::call(
        1,
        "echo",
        json!({ "text": "hi" }),
        json!({ "traceparent": TRACEPARENT }),
    );
    let answer = send(router, request).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    // Its `tracing` parent is the SDK's own task span; its trace is the caller's.
    let opened = recorder.opened("mcp.server.request");
    let fields = opened.split_once(" otel.name").unwrap().1;
    assert_eq!(
        fields,
        "=\"tools/call echo\" otel.kind=\"server\" mcp.method.name=\"tools/call\" \
         gen_ai.tool.name=\"echo\" trace_id=\"4bf92f3577b34da6a3ce929d0e0e4736\" \
         parent_id=\"00f067aa0ba902b7\""
    );
    assert!(
        recorder
            .opened("execute_tool")
            .contains("parent=mcp.server.request")
    );
}
