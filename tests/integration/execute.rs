//! `POST /agent/execute`: every status and code of protocol.md §4 that the runtime produces.

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::Principal;
use carmy_tests::{Answer, execute, execute_request, send};
use serde_json::{Value, json};

use crate::executions::{self, ALICE, ASYNC, BOB};
use crate::tools::{self, Probe};

fn router(probe: &Probe) -> axum::Router {
    tools::app(probe).router().unwrap()
}

/// Checks the envelope every execute answer shares.
fn assert_execution(answer: &Answer, status: StatusCode, execution_status: &str) -> Value {
    assert_eq!(
        answer.status,
        status,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    let body = answer.json();
    let id = body["execution_id"].as_str().unwrap();
    let uuid = id.strip_prefix("exec_").unwrap();
    assert_eq!(uuid.len(), 36, "{id}");
    assert_eq!(&uuid[14..15], "7", "a version-7 uuid: {id}");
    assert_eq!(body["status"], execution_status);
    assert!(body["_agent"]["next_actions"].is_array());
    if execution_status == "completed" {
        assert!(body.get("error").is_none());
    } else {
        assert!(body.get("data").is_none());
        let error = &body["error"];
        for field in ["code", "message", "category"] {
            assert!(error[field].is_string(), "{field}: {error}");
        }
        assert!(error["recoverable"].is_boolean());
        assert!(error["retryable"].is_boolean());
        assert_eq!(body["_agent"]["cacheable"], false);
    }
    body
}

fn assert_rejection(answer: &Answer, status: StatusCode, code: &str) -> Value {
    assert_eq!(
        answer.status,
        status,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    let body = answer.json();
    assert!(body.get("execution_id").is_none(), "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    body
}

#[tokio::test]
async fn a_completed_call() {
    let router = router(&Probe::default());
    let answer = execute(
        &router,
        &json!({ "tool": "echo", "arguments": { "text": "hi" } }),
    )
    .await;
    let body = assert_execution(&answer, StatusCode::OK, "completed");
    assert_eq!(body["data"], json!({ "text": "hi" }));
    assert_eq!(
        body["_agent"],
        json!({ "cacheable": true, "next_actions": [] })
    );
    assert!(answer.header("carmy-replayed").is_none());
    let keys: Vec<_> = body.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["execution_id", "status", "data", "_agent"]);
}

#[tokio::test]
async fn only_idempotent_reads_are_cacheable() {
    let router = router(&Probe::default());
    let read = execute(
        &router,
        &json!({ "tool": "slow_read", "arguments": { "millis": 0 } }),
    )
    .await;
    assert_eq!(
        assert_execution(&read, StatusCode::OK, "completed")["_agent"]["cacheable"],
        true
    );
    let write = execute(
        &router,
        &json!({ "tool": "count", "arguments": { "text": "x" } }),
    )
    .await;
    assert_eq!(
        assert_execution(&write, StatusCode::OK, "completed")["_agent"]["cacheable"],
        false
    );
}

#[tokio::test]
async fn arguments_default_to_an_empty_object() {
    let router = shop::app().router().unwrap();
    let answer = execute(&router, &json!({ "tool": "list_products" })).await;
    let body = assert_execution(&answer, StatusCode::OK, "completed");
    assert_eq!(body["data"]["products"][0]["sku"], "KB-01");
}

#[tokio::test]
async fn unknown_tool_is_404_tool_not_found() {
    let router = router(&Probe::default());
    let answer = execute(&router, &json!({ "tool": "nope" })).await;
    let body = assert_execution(&answer, StatusCode::NOT_FOUND, "failed");
    assert_eq!(body["error"]["code"], "TOOL_NOT_FOUND");
    assert_eq!(body["error"]["category"], "not_found");
}

#[tokio::test]
async fn invalid_arguments_list_every_violation_with_json_pointers() {
    let router = router(&Probe::default());
    let answer = execute(
        &router,
        &json!({ "tool": "create_order", "arguments": { "sku": 42, "quantity": 0, "colour": "red" } }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND, "not in this app");

    let router = shop::app().router().unwrap();
    let answer = execute(
        &router,
        &json!({ "tool": "create_order", "arguments": { "sku": 42, "quantity": 0, "colour": "red" } }),
    )
    .await;
    let body = assert_execution(&answer, StatusCode::BAD_REQUEST, "failed");
    let error = &body["error"];
    assert_eq!(error["code"], "INVALID_ARGUMENTS");
    assert_eq!(error["message"], "arguments do not match the input schema");
    assert_eq!(error["category"], "validation");
    assert_eq!(error["recoverable"], true);
    assert_eq!(error["retryable"], false);
    let mut found: Vec<(String, String)> = error["details"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|violation| {
            assert!(violation["message"].is_string());
            let keys: Vec<_> = violation.as_object().unwrap().keys().cloned().collect();
            assert_eq!(keys, ["path", "keyword", "message"]);
            (
                violation["path"].as_str().unwrap().to_owned(),
                violation["keyword"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    found.sort();
    assert_eq!(
        found,
        [
            (String::new(), "additionalProperties".to_owned()),
            ("/quantity".to_owned(), "minimum".to_owned()),
            ("/sku".to_owned(), "type".to_owned()),
        ]
    );
}

#[tokio::test]
async fn non_object_arguments_are_invalid_arguments() {
    let router = router(&Probe::default());
    for arguments in [json!(null), json!(42), json!([1]), json!("text")] {
        let answer = execute(&router, &json!({ "tool": "echo", "arguments": arguments })).await;
        let body = assert_execution(&answer, StatusCode::BAD_REQUEST, "failed");
        assert_eq!(body["error"]["code"], "INVALID_ARGUMENTS", "{arguments}");
    }
}

#[tokio::test]
async fn a_types_refusal_never_echoes_a_large_input() {
    let router = router(&Probe::default());
    let word = format!("forbidden{}", "x".repeat(200 * 1024));
    let answer = execute(
        &router,
        &json!({ "tool": "picky", "arguments": { "word": word } }),
    )
    .await;
    assert!(answer.body.len() < 16 * 1024, "{} bytes", answer.body.len());
    let body = assert_execution(&answer, StatusCode::BAD_REQUEST, "failed");
    let message = body["error"]["details"]["errors"][0]["message"]
        .as_str()
        .unwrap();
    assert!(message.starts_with("the word \"forbiddenxxx"), "{message}");
    assert!(message.ends_with('…'), "{message}");
}

#[tokio::test]
async fn arguments_the_type_refuses_are_invalid_arguments_and_nothing_runs() {
    let probe = Probe::default();
    let router = router(&probe);
    let answer = execute(
        &router,
        &json!({ "tool": "picky", "arguments": { "word": "forbidden" }, "request_id": "p1" }),
    )
    .await;
    let body = assert_execution(&answer, StatusCode::BAD_REQUEST, "failed");
    assert_eq!(body["error"]["code"], "INVALID_ARGUMENTS");
    assert_eq!(
        body["error"]["details"]["errors"][0]["keyword"],
        "deserialize"
    );
    assert_eq!(probe.runs(), 0);
    // Rejected before running: the id stays free.
    let answer = execute(
        &router,
        &json!({ "tool": "picky", "arguments": { "word": "fine" }, "request_id": "p1" }),
    )
    .await;
    assert_execution(&answer, StatusCode::OK, "completed");
}

#[tokio::test]
async fn malformed_requests_are_400_invalid_request_before_any_execution() {
    let router = router(&Probe::default());
    let cases: Vec<(Request<Body>, &str)> = vec![
        (
            Request::post("/agent/execute")
                .header("content-type", "application/json")
                .body(Body::from("{not json"))
                .unwrap(),
            "invalid request body",
        ),
        (
            Request::post("/agent/execute")
                .header("content-type", "text/plain")
                .body(Body::from("{\"tool\":\"echo\"}"))
                .unwrap(),
            "content type",
        ),
        (
            Request::post("/agent/execute")
                .body(Body::from("{\"tool\":\"echo\"}"))
                .unwrap(),
            "content type",
        ),
        (
            execute_request(
                &json!({ "tool": "echo", "context": { "admin": true } }),
                &[],
            ),
            "unknown field `context`",
        ),
        (
            execute_request(
                &json!({ "tool": "echo", "permissions": ["confirm:wipe"] }),
                &[],
            ),
            "unknown field `permissions`",
        ),
        (
            execute_request(&json!({ "arguments": {} }), &[]),
            "missing field `tool`",
        ),
        (execute_request(&json!({ "tool": 7 }), &[]), "invalid type"),
        (
            execute_request(&json!({ "tool": "echo", "request_id": "" }), &[]),
            "request_id",
        ),
        (
            execute_request(
                &json!({ "tool": "echo", "request_id": "x".repeat(257) }),
                &[],
            ),
            "request_id",
        ),
        (
            execute_request(&json!({ "tool": "echo", "request_id": "tab\there" }), &[]),
            "request_id",
        ),
        (
            execute_request(&json!({ "tool": "echo", "request_id": "é" }), &[]),
            "request_id",
        ),
        (
            execute_request(&json!({ "tool": "echo", "request_id": 12 }), &[]),
            "invalid type",
        ),
        (
            execute_request(
                &json!({ "tool": "echo", "request_id": "a" }),
                &[("idempotency-key", "b")],
            ),
            "differ",
        ),
        (
            execute_request(&json!({ "tool": "echo" }), &[("idempotency-key", "")]),
            "request_id",
        ),
        (
            Request::post("/agent/execute")
                .header("content-type", "application/json")
                .body(Body::from("[]"))
                .unwrap(),
            "invalid request body",
        ),
    ];
    for (request, reason) in cases {
        let answer = send(&router, request).await;
        let body = assert_rejection(&answer, StatusCode::BAD_REQUEST, "INVALID_REQUEST");
        assert_eq!(body["error"]["category"], "validation");
        let detail = body["error"]["details"]["reason"].as_str().unwrap();
        assert!(
            detail.contains(reason),
            "{detail:?} should mention {reason:?}"
        );
    }
}

#[tokio::test]
async fn request_ids_of_256_printable_bytes_and_matching_headers_are_accepted() {
    let router = router(&Probe::default());
    let long = "~".repeat(256);
    for request in [
        execute_request(
            &json!({ "tool": "echo", "arguments": { "text": "a" }, "request_id": long }),
            &[],
        ),
        execute_request(
            &json!({ "tool": "echo", "arguments": { "text": "a" }, "request_id": " spaces are printable " }),
            &[],
        ),
        execute_request(
            &json!({ "tool": "echo", "arguments": { "text": "a" }, "request_id": "same" }),
            &[("idempotency-key", "same")],
        ),
        execute_request(
            &json!({ "tool": "echo", "arguments": { "text": "a" } }),
            &[("idempotency-key", "header-only")],
        ),
        execute_request(
            &json!({ "tool": "echo", "arguments": { "text": "a" } }),
            &[("content-type", "application/json; charset=utf-8")],
        ),
    ] {
        let answer = send(&router, request).await;
        assert_execution(&answer, StatusCode::OK, "completed");
    }
}

#[tokio::test]
async fn the_body_limit_is_one_mebibyte_on_both_sides() {
    let router = router(&Probe::default());
    let skeleton = json!({ "tool": "echo", "arguments": { "text": "" } }).to_string();
    let limit = 1024 * 1024;
    let at_limit = skeleton.replace(
        "\"text\":\"\"",
        &format!("\"text\":\"{}\"", "a".repeat(limit - skeleton.len())),
    );
    assert_eq!(at_limit.len(), limit);
    let request = Request::post("/agent/execute")
        .header("content-type", "application/json")
        .body(Body::from(at_limit.clone()))
        .unwrap();
    let answer = send(&router, request).await;
    assert_execution(&answer, StatusCode::OK, "completed");

    let over = at_limit.replacen("\"text\":\"", "\"text\":\"a", 1);
    assert_eq!(over.len(), limit + 1);
    let request = Request::post("/agent/execute")
        .header("content-type", "application/json")
        .body(Body::from(over.clone()))
        .unwrap();
    let answer = send(&router, request).await;
    let body = assert_rejection(&answer, StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE");
    assert_eq!(body["error"]["details"]["limit_bytes"], limit);

    // Without a Content-Length (a streamed body), the limit still holds.
    let chunks: Vec<Result<Vec<u8>, std::io::Error>> = over
        .into_bytes()
        .chunks(64 * 1024)
        .map(|chunk| Ok(chunk.to_vec()))
        .collect();
    let request = Request::post("/agent/execute")
        .header("content-type", "application/json")
        .body(Body::from_stream(futures_util::stream::iter(chunks)))
        .unwrap();
    let answer = send(&router, request).await;
    assert_rejection(&answer, StatusCode::PAYLOAD_TOO_LARGE, "PAYLOAD_TOO_LARGE");
}

#[tokio::test]
async fn wrong_methods_on_execute_are_405_json() {
    let router = router(&Probe::default());
    let answer = carmy_tests::get(&router, "/agent/execute").await;
    assert_rejection(
        &answer,
        StatusCode::METHOD_NOT_ALLOWED,
        "METHOD_NOT_ALLOWED",
    );
}

#[tokio::test]
async fn confirmation_comes_only_from_the_server_side() {
    let probe = Probe::default();
    let router = router(&probe);
    let answer = execute(&router, &json!({ "tool": "wipe" })).await;
    let body = assert_execution(&answer, StatusCode::FORBIDDEN, "failed");
    assert_eq!(body["error"]["code"], "CONFIRMATION_REQUIRED");
    assert_eq!(body["error"]["category"], "permission");
    assert_eq!(body["error"]["recoverable"], true);
    assert_eq!(body["_agent"]["next_actions"][0]["tool"], "wipe");
    assert!(
        body["_agent"]["next_actions"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("confirm:wipe")
    );
    assert_eq!(probe.runs(), 0);

    // Host middleware vouches for the caller and grants the confirmation.
    let confirmed = router.clone().layer(axum::middleware::from_fn(
        |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
            request.extensions_mut().insert(
                Principal::new("alice", carmy::TrustLevel::Known).with_permission("confirm:wipe"),
            );
            next.run(request).await
        },
    ));
    let answer = execute(&confirmed, &json!({ "tool": "wipe" })).await;
    let body = assert_execution(&answer, StatusCode::OK, "completed");
    assert_eq!(body["data"]["text"], "wiped by alice");
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn a_tool_error_keeps_its_code_and_suggests_the_named_tool() {
    let router = router(&Probe::default());
    let answer = execute(&router, &json!({ "tool": "refuse" })).await;
    let body = assert_execution(&answer, StatusCode::CONFLICT, "failed");
    assert_eq!(body["error"]["code"], "OUT_OF_STOCK");
    assert_eq!(body["error"]["suggested_action"], "echo");
    let actions = body["_agent"]["next_actions"].as_array().unwrap();
    assert_eq!(actions.len(), 1, "no retry of a final failure: {actions:?}");
    assert_eq!(actions[0]["tool"], "echo");
}

#[tokio::test]
async fn retryable_errors_carry_retry_after_and_a_retry_suggestion() {
    let router = router(&Probe::default());
    let answer = execute(&router, &json!({ "tool": "flaky", "request_id": "f1" })).await;
    let body = assert_execution(&answer, StatusCode::SERVICE_UNAVAILABLE, "failed");
    assert_eq!(answer.header("retry-after"), Some("2"), "1.5 s rounds up");
    assert_eq!(body["error"]["retryable"], true);
    assert_eq!(body["error"]["retry_after"], 2);
    assert_eq!(
        body["_agent"]["next_actions"],
        json!([{ "tool": "flaky", "arguments": {}, "reason": "the same call may succeed later: retry it with the same request_id", "after_ms": 1500 }])
    );
}

#[tokio::test]
async fn a_panicking_tool_is_500_tool_panic_and_the_server_keeps_serving() {
    let router = router(&Probe::default());
    // One panics before it ever waits, the other after.
    for tool in ["explode", "explode_later"] {
        let answer = execute(&router, &json!({ "tool": tool })).await;
        let body = assert_execution(&answer, StatusCode::INTERNAL_SERVER_ERROR, "failed");
        assert_eq!(body["error"]["code"], "TOOL_PANIC", "{tool}");
        assert!(
            !answer.body.windows(6).any(|window| window == b"secret"),
            "{tool}: the panic message stays in the logs"
        );
        let next = execute(
            &router,
            &json!({ "tool": "echo", "arguments": { "text": "still here" } }),
        )
        .await;
        assert_execution(&next, StatusCode::OK, "completed");
    }
}

#[tokio::test]
async fn what_a_tool_hands_to_other_tasks_sees_the_cancellation_once_the_call_ends() {
    for token_first in [true, false] {
        let probe = Probe::default();
        let router = router(&probe);
        let saw_cancellation = probe.saw_cancellation.notified();
        let call = json!({ "tool": "hand_off", "arguments": { "token_first": token_first } });
        let answer = execute(&router, &call).await;
        assert_execution(&answer, StatusCode::OK, "completed");
        tokio::time::timeout(Duration::from_secs(1), saw_cancellation)
            .await
            .unwrap_or_else(|_| panic!("token_first {token_first}: the task saw no cancellation"));
    }
}

#[tokio::test]
async fn an_unserializable_output_is_500_invalid_output() {
    let router = router(&Probe::default());
    let answer = execute(&router, &json!({ "tool": "broken_output" })).await;
    let body = assert_execution(&answer, StatusCode::INTERNAL_SERVER_ERROR, "failed");
    assert_eq!(body["error"]["code"], "INVALID_OUTPUT");
    assert!(!String::from_utf8_lossy(&answer.body).contains("on purpose"));
}

#[tokio::test(start_paused = true)]
async fn a_deadline_ends_in_504_timeout_well_within_twice_the_timeout() {
    let probe = Probe::default();
    let router = router(&probe);
    let started = tokio::time::Instant::now();
    let answer = execute(
        &router,
        &json!({ "tool": "slow_read", "arguments": { "millis": 60_000 } }),
    )
    .await;
    let elapsed = started.elapsed();
    let body = assert_execution(&answer, StatusCode::GATEWAY_TIMEOUT, "timed_out");
    assert_eq!(body["error"]["code"], "TIMEOUT");
    assert_eq!(body["error"]["category"], "timeout");
    assert_eq!(body["error"]["details"]["timeout_ms"], 2000);
    assert!(
        elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(4),
        "{elapsed:?}"
    );
    // An idempotent read is safe to run again, and says so.
    assert_eq!(body["error"]["retryable"], true);
    assert_eq!(body["_agent"]["next_actions"][0]["tool"], "slow_read");
}

#[tokio::test(start_paused = true)]
async fn the_app_default_timeout_applies_to_tools_without_one() {
    let router = shop::app()
        .default_timeout(Duration::from_secs(1))
        .router()
        .unwrap();
    let started = tokio::time::Instant::now();
    let answer = execute(
        &router,
        &json!({ "tool": "generate_report", "arguments": { "seconds": 5 } }),
    )
    .await;
    assert_execution(&answer, StatusCode::GATEWAY_TIMEOUT, "timed_out");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn too_many_executions_in_flight_is_503_overloaded() {
    let probe = Probe::default();
    let router = tools::app(&probe).max_in_flight(1).router().unwrap();
    let slow = tokio::spawn({
        let router = router.clone();
        async move {
            execute(
                &router,
                &json!({ "tool": "slow_read", "arguments": { "millis": 500 } }),
            )
            .await
        }
    });
    probe.wait_runs(1).await;
    let answer = execute(
        &router,
        &json!({ "tool": "echo", "arguments": { "text": "x" }, "request_id": "o1" }),
    )
    .await;
    let body = assert_execution(&answer, StatusCode::SERVICE_UNAVAILABLE, "failed");
    assert_eq!(body["error"]["code"], "OVERLOADED");
    assert_eq!(body["error"]["retryable"], true);
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(slow.await.unwrap().status, StatusCode::OK);
    // Nothing was kept for o1: it runs once there is room.
    let answer = execute(
        &router,
        &json!({ "tool": "echo", "arguments": { "text": "x" }, "request_id": "o1" }),
    )
    .await;
    assert_execution(&answer, StatusCode::OK, "completed");
    assert!(answer.header("carmy-replayed").is_none());
}

/// One caller may hold half the in-flight slots: past it, its calls are refused with a
/// retryable `503 OVERLOADED` while the other callers' calls are still served.
#[tokio::test]
async fn one_caller_cannot_take_every_in_flight_slot() {
    let probe = Probe::default();
    let router = executions::app(&probe).max_in_flight(4).router().unwrap();
    let slow = json!({ "tool": "slow_read", "arguments": { "millis": 1_500 } });
    // A synchronous call and async ones, all Bob's, all running.
    let waiting = tokio::spawn({
        let router = router.clone();
        let slow = slow.clone();
        async move { executions::start(&router, &slow, &[BOB]).await }
    });
    probe.wait_runs(1).await;
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let answer = executions::start(&router, &slow, &[BOB, ASYNC]).await;
        if answer.status == StatusCode::SERVICE_UNAVAILABLE {
            let body = answer.json();
            assert_eq!(body["error"]["code"], "OVERLOADED");
            assert_eq!(body["error"]["retryable"], true);
            assert_eq!(answer.header("retry-after"), Some("1"));
        }
        statuses.push(answer.status.as_u16());
    }
    assert_eq!(statuses, [202, 503, 503, 503, 503], "Bob holds his half");
    let quick = json!({ "tool": "echo", "arguments": { "text": "x" } });
    let refused = executions::start(&router, &quick, &[BOB]).await;
    assert_execution(&refused, StatusCode::SERVICE_UNAVAILABLE, "failed");

    // Alice and an anonymous caller are served.
    let served = executions::start(&router, &quick, &[ALICE]).await;
    assert_execution(&served, StatusCode::OK, "completed");
    let served = executions::start(&router, &quick, &[]).await;
    assert_execution(&served, StatusCode::OK, "completed");
    assert_execution(&waiting.await.unwrap(), StatusCode::OK, "completed");

    // A share of every slot lets one caller take them all.
    let probe = Probe::default();
    let router = executions::app(&probe)
        .max_in_flight(4)
        .max_in_flight_per_caller(4)
        .router()
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let answer = executions::start(&router, &slow, &[BOB, ASYNC]).await;
        statuses.push(answer.status.as_u16());
    }
    assert_eq!(statuses, [202, 202, 202, 202, 503]);
    let refused = executions::start(&router, &quick, &[ALICE]).await;
    assert_execution(&refused, StatusCode::SERVICE_UNAVAILABLE, "failed");
}

#[tokio::test]
async fn tools_that_are_not_parallel_safe_run_one_at_a_time() {
    let probe = Probe::default();
    let router = router(&probe);
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let router = router.clone();
            tokio::spawn(async move { execute(&router, &json!({ "tool": "one_at_a_time" })).await })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().status, StatusCode::OK);
    }
    assert_eq!(probe.runs(), 8);
    assert_eq!(
        probe.most_running.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

#[tokio::test]
async fn the_example_tools_work_end_to_end() {
    let router = shop::app().router().unwrap();
    let first = execute(
        &router,
        &json!({ "tool": "create_order", "arguments": { "sku": "MS-01", "quantity": 2 } }),
    )
    .await;
    assert_eq!(
        assert_execution(&first, StatusCode::OK, "completed")["data"],
        json!({ "order_id": 1 })
    );
    let order = execute(
        &router,
        &json!({ "tool": "get_order", "arguments": { "order_id": 1 } }),
    )
    .await;
    assert_eq!(
        assert_execution(&order, StatusCode::OK, "completed")["data"],
        json!({ "order_id": 1, "sku": "MS-01", "quantity": 2, "status": "placed" })
    );
    let out = execute(
        &router,
        &json!({ "tool": "create_order", "arguments": { "sku": "MS-01", "quantity": 2 } }),
    )
    .await;
    let body = assert_execution(&out, StatusCode::CONFLICT, "failed");
    assert_eq!(body["error"]["code"], "OUT_OF_STOCK");
    assert_eq!(
        body["error"]["details"],
        json!({ "sku": "MS-01", "stock": 1 })
    );
    let unknown = execute(
        &router,
        &json!({ "tool": "create_order", "arguments": { "sku": "XX-99" } }),
    )
    .await;
    let body = assert_execution(&unknown, StatusCode::NOT_FOUND, "failed");
    assert_eq!(body["error"]["code"], "PRODUCT_NOT_FOUND");
    assert_eq!(body["_agent"]["next_actions"][0]["tool"], "list_products");
    let missing = execute(
        &router,
        &json!({ "tool": "get_order", "arguments": { "order_id": 99 } }),
    )
    .await;
    assert_eq!(
        assert_execution(&missing, StatusCode::NOT_FOUND, "failed")["error"]["code"],
        "ORDER_NOT_FOUND"
    );
    let report = execute(
        &router,
        &json!({ "tool": "generate_report", "arguments": { "seconds": 0 } }),
    )
    .await;
    assert_execution(&report, StatusCode::OK, "completed");
}

#[tokio::test]
async fn outputs_match_their_advertised_schemas() {
    let router = shop::app().router().unwrap();
    let catalog = carmy_tests::get(&router, "/agent/tools").await.json();
    let schema_of = |name: &str| {
        let tool = catalog["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|tool| tool["name"] == name)
            .unwrap();
        jsonschema::validator_for(&tool["output_schema"]).unwrap()
    };
    for (tool, arguments) in [
        ("list_products", json!({})),
        ("create_order", json!({ "sku": "KB-01" })),
        ("get_order", json!({ "order_id": 1 })),
        ("generate_report", json!({ "seconds": 0 })),
    ] {
        let answer = execute(&router, &json!({ "tool": tool, "arguments": arguments })).await;
        let data = answer.json()["data"].clone();
        let errors: Vec<_> = schema_of(tool)
            .iter_errors(&data)
            .map(|error| error.to_string())
            .collect();
        assert!(errors.is_empty(), "{tool}: {errors:?} for {data}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_cancel_order_confirmation_gate_and_its_effect() {
    let router = shop::app()
        .router()
        .unwrap()
        .layer(axum::middleware::from_fn(
            |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                if request.headers().contains_key("x-user-confirmed") {
                    request.extensions_mut().insert(
                        Principal::new("operator", carmy::TrustLevel::Internal)
                            .with_permission("confirm:cancel_order"),
                    );
                }
                next.run(request).await
            },
        ));
    execute(
        &router,
        &json!({ "tool": "create_order", "arguments": { "sku": "MS-01", "quantity": 3 } }),
    )
    .await;
    let refused = execute(
        &router,
        &json!({ "tool": "cancel_order", "arguments": { "order_id": 1 } }),
    )
    .await;
    assert_eq!(refused.json()["error"]["code"], "CONFIRMATION_REQUIRED");
    let request = execute_request(
        &json!({ "tool": "cancel_order", "arguments": { "order_id": 1 } }),
        &[("x-user-confirmed", "yes")],
    );
    let cancelled = send(&router, request).await;
    assert_eq!(cancelled.json()["data"]["status"], "cancelled");
    let products = execute(&router, &json!({ "tool": "list_products" })).await;
    assert_eq!(
        products.json()["data"]["products"][1],
        json!({ "sku": "MS-01", "name": "Wireless mouse", "price_cents": 2900, "stock": 3 })
    );
}
