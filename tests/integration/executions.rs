//! Executions as resources (protocol.md §9) on the default in-memory store: async starts,
//! lookups, re-attachment, cancellation and the list, each scoped to its caller.

use std::time::Duration;

use axum::http::StatusCode;
use axum::http::request::Parts;
use carmy::auth::Authenticator;
use carmy::store::{Engine, PostgresStore, RedisStore};
use carmy::{Context, JsonSchema, Principal, State, ToolError, TrustLevel};
use carmy_tests::wait::until;
use carmy_tests::{Answer, Server, execute_request, get, get_with, parse_sse, request, send};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::tools::{self, Probe};

/// `Bearer alice`, `Bearer bob` (both `known`) and `Bearer root` (`internal`); no header is
/// anonymous.
pub(crate) struct Tokens;

impl Authenticator for Tokens {
    fn authenticate<'a>(
        &'a self,
        request: &'a Parts,
    ) -> BoxFuture<'a, Result<Option<Principal>, ToolError>> {
        Box::pin(async move {
            let token = request
                .headers
                .get("authorization")
                .and_then(|value| value.to_str().ok());
            Ok(match token {
                Some("Bearer alice") => Some(Principal::new("alice", TrustLevel::Known)),
                Some("Bearer bob") => Some(Principal::new("bob", TrustLevel::Known)),
                Some("Bearer root") => Some(Principal::new("root", TrustLevel::Internal)),
                _ => None,
            })
        })
    }
}

pub(crate) const ALICE: (&str, &str) = ("authorization", "Bearer alice");
pub(crate) const BOB: (&str, &str) = ("authorization", "Bearer bob");
const ROOT: (&str, &str) = ("authorization", "Bearer root");
pub(crate) const ASYNC: (&str, &str) = ("prefer", "respond-async");

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Chatter {
    /// Progress events to report.
    reports: u64,
    /// How long to work after them.
    millis: u64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Said {
    reports: u64,
}

/// Reports progress `reports` times, then works `millis`.
#[carmy::tool(effect = "none", register = false)]
pub(crate) async fn chatty(ctx: Context, input: Chatter) -> Result<Said, ToolError> {
    for report in 1..=input.reports {
        ctx.progress(report, input.reports, None);
    }
    tokio::time::sleep(Duration::from_millis(input.millis)).await;
    Ok(Said {
        reports: input.reports,
    })
}

/// Always answered `202`.
#[carmy::tool(effect = "none", mode = "async", register = false)]
pub(crate) async fn detached(input: Chatter) -> Result<Said, ToolError> {
    tokio::time::sleep(Duration::from_millis(input.millis)).await;
    Ok(Said {
        reports: input.reports,
    })
}

/// Never answered `202`.
#[carmy::tool(effect = "none", mode = "sync", register = false)]
pub(crate) async fn attached(input: Chatter) -> Result<Said, ToolError> {
    Ok(Said {
        reports: input.reports,
    })
}

/// Opened by the test: [`gated`] ends when it is.
#[derive(Clone, Default)]
pub(crate) struct Gate {
    open: std::sync::Arc<tokio::sync::Notify>,
}

/// Runs until the test opens its gate.
#[carmy::tool(effect = "write", register = false)]
pub(crate) async fn gated(
    State(probe): State<Probe>,
    State(gate): State<Gate>,
) -> Result<Said, ToolError> {
    let open = gate.open.notified();
    tokio::pin!(open);
    open.as_mut().enable();
    probe.runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    probe.started.notify_waiters();
    open.await;
    Ok(Said { reports: 0 })
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Ending {
    /// `missing`, `refused`, `panicked` or `late`.
    how: String,
}

/// Ends as it is told: a tool's own not-found, a conflict, a panic, or past its deadline.
#[carmy::tool(effect = "write", timeout = "200ms", register = false)]
pub(crate) async fn ends(input: Ending) -> Result<Said, ToolError> {
    match input.how.as_str() {
        "missing" => Err(ToolError::not_found("ORDER_NOT_FOUND", "no such order")),
        "refused" => Err(ToolError::conflict("OUT_OF_STOCK", "nothing left")),
        "panicked" => panic!("on purpose"),
        _ => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(Said { reports: 0 })
        }
    }
}

pub(crate) fn app(probe: &Probe) -> carmy::App {
    tools::app(probe)
        .tool(chatty::TOOL)
        .tool(detached::TOOL)
        .tool(attached::TOOL)
        .tool(gated::TOOL)
        .tool(ends::TOOL)
        .state(Gate::default())
        .authenticator(Tokens)
}

pub(crate) async fn start(router: &axum::Router, call: &Value, headers: &[(&str, &str)]) -> Answer {
    send(router, execute_request(call, headers)).await
}

/// How long an execution here may take to end: the longest a tool runs is 30 s (`ends`), and
/// under load the store's waits count against it.
const ENDS_WITHIN: Duration = Duration::from_secs(60);

/// Reads the execution until it has ended; fails the test after [`ENDS_WITHIN`].
pub(crate) async fn wait_ended(router: &axum::Router, location: &str, who: (&str, &str)) -> Answer {
    until(ENDS_WITHIN, &format!("{location} ends"), async || {
        let answer = get_with(router, location, &[who]).await;
        (answer.json()["status"] != "running").then_some(answer)
    })
    .await
}

pub(crate) fn chatter(reports: u64, millis: u64) -> Value {
    json!({ "tool": "chatty", "arguments": { "reports": reports, "millis": millis } })
}

#[tokio::test]
async fn respond_async_answers_202_and_the_lookup_gives_the_answer_byte_for_byte() {
    let router = app(&Probe::default()).router().unwrap();
    let mut call = chatter(3, 300);
    call["request_id"] = json!("report-1");
    let accepted = start(&router, &call, &[ALICE, ASYNC]).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    assert_eq!(accepted.header("preference-applied"), Some("respond-async"));
    assert_eq!(accepted.header("retry-after"), Some("1"));
    assert_eq!(accepted.header("cache-control"), Some("no-store"));
    let body = accepted.json();
    let id = body["execution_id"].as_str().unwrap().to_owned();
    let location = format!("/agent/executions/{id}");
    assert_eq!(accepted.header("location"), Some(location.as_str()));
    let keys: Vec<_> = body.as_object().unwrap().keys().cloned().collect();
    assert_eq!(keys, ["execution_id", "tool", "status", "created_at"]);
    assert_eq!(body["tool"], "chatty");
    assert_eq!(body["status"], "running");
    assert!(
        body["created_at"].as_str().unwrap().ends_with('Z'),
        "{body}"
    );

    let running = send(&router, request("GET", &location, &[ALICE])).await;
    assert_eq!(running.status, StatusCode::OK);
    assert_eq!(running.json()["status"], "running");
    assert_eq!(running.json()["created_at"], body["created_at"]);
    assert_eq!(running.header("retry-after"), Some("1"));

    let ended = wait_ended(&router, &location, ALICE).await;
    assert_eq!(ended.status, StatusCode::OK);
    assert_eq!(ended.json()["data"], json!({ "reports": 3 }));
    let replay = start(&router, &call, &[ALICE]).await;
    assert_eq!(replay.header("carmy-replayed"), Some("true"));
    assert_eq!(
        replay.body, ended.body,
        "the lookup is the answer, byte for byte"
    );
    // A duplicate async start with the same request_id once finished gets the record.
    let again = start(&router, &call, &[ALICE, ASYNC]).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body, ended.body);
}

#[tokio::test]
async fn another_caller_an_anonymous_one_and_a_wrong_id_all_get_the_same_404() {
    let probe = Probe::default();
    let router = app(&probe).router().unwrap();
    let call = json!({ "tool": "slow_write", "arguments": { "millis": 400 } });
    let accepted = start(&router, &call, &[ALICE, ASYNC]).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    let id = accepted.json()["execution_id"].as_str().unwrap().to_owned();
    let location = format!("/agent/executions/{id}");

    let missing = send(
        &router,
        request(
            "GET",
            "/agent/executions/exec_01948000-0000-7000-8000-000000000000",
            &[ALICE],
        ),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["error"]["code"], "EXECUTION_NOT_FOUND");
    for (path, headers) in [
        (location.as_str(), vec![BOB]),
        (location.as_str(), vec![ROOT]),
        (location.as_str(), vec![]),
        ("/agent/executions/exec_nonsense", vec![ALICE]),
        ("/agent/executions/%FF%FE", vec![ALICE]),
    ] {
        let answer = send(&router, request("GET", path, &headers)).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path} {headers:?}");
        assert_eq!(answer.body, missing.body, "{path} {headers:?}");
        let events = send(&router, request("GET", &format!("{path}/events"), &headers)).await;
        assert_eq!(events.body, missing.body, "{path}/events {headers:?}");
        let cancel = send(&router, request("DELETE", path, &headers)).await;
        assert_eq!(cancel.status, StatusCode::NOT_FOUND, "{path} {headers:?}");
        assert_eq!(cancel.body, missing.body, "{path} {headers:?}");
    }
    // Nobody else's DELETE cancelled it.
    let ended = wait_ended(&router, &location, ALICE).await;
    assert_eq!(ended.json()["status"], "completed", "{}", ended.json());
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn re_attaching_replays_the_events_with_their_ids_keeping_the_latest_100_progress() {
    let router = app(&Probe::default()).router().unwrap();
    let accepted = start(&router, &chatter(150, 200), &[ALICE, ASYNC]).await;
    let id = accepted.json()["execution_id"].as_str().unwrap().to_owned();
    let events_path = format!("/agent/executions/{id}/events");

    // Attached while it runs: the recorded events, then the live ones, to the end.
    let live = send(&router, request("GET", &events_path, &[ALICE])).await;
    assert_eq!(live.status, StatusCode::OK);
    assert_eq!(live.header("content-type"), Some("text/event-stream"));
    let events = parse_sse(std::str::from_utf8(&live.body).unwrap());
    let events: Vec<_> = events.into_iter().filter(|event| !event.comment).collect();
    assert_eq!(events[0].event.as_deref(), Some("execution.started"));
    assert_eq!(events[0].id.as_deref(), Some("1"));
    assert_eq!(
        events[0].json(),
        json!({ "execution_id": id, "tool": "chatty" })
    );
    let progress: Vec<_> = events[1..events.len() - 1].iter().collect();
    assert_eq!(
        progress.len(),
        100,
        "the latest 100 progress events are kept"
    );
    let ids: Vec<u64> = progress
        .iter()
        .map(|event| event.id.as_deref().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ids, (52..=151).collect::<Vec<u64>>());
    assert_eq!(
        progress[0].json(),
        json!({ "execution_id": id, "progress": 51, "total": 150 })
    );
    let last = events.last().unwrap();
    assert_eq!(last.event.as_deref(), Some("execution.completed"));
    assert_eq!(last.id.as_deref(), Some("152"));
    assert_eq!(last.json()["data"], json!({ "reports": 150 }));
    assert_eq!(last.json()["replayed"], false);

    // After it ended, from an id on: only what followed.
    let resumed = send(
        &router,
        request("GET", &events_path, &[ALICE, ("last-event-id", "150")]),
    )
    .await;
    let resumed = parse_sse(std::str::from_utf8(&resumed.body).unwrap());
    let ids: Vec<_> = resumed
        .iter()
        .map(|event| event.id.clone().unwrap())
        .collect();
    assert_eq!(ids, ["151", "152"]);
    assert_eq!(resumed[1], *last);

    let bad = send(
        &router,
        request("GET", &events_path, &[ALICE, ("last-event-id", "x")]),
    )
    .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.json()["error"]["details"]["parameter"], "Last-Event-ID");
}

#[tokio::test]
async fn delete_cancels_a_running_execution_and_409s_once_it_has_ended() {
    let probe = Probe::default();
    let router = app(&probe).router().unwrap();
    let call = json!({ "tool": "slow_write", "arguments": { "millis": 10_000 } });
    let accepted = start(&router, &call, &[ALICE, ASYNC]).await;
    let id = accepted.json()["execution_id"].as_str().unwrap().to_owned();
    let location = format!("/agent/executions/{id}");
    probe.wait_runs(1).await;

    let cancel = send(&router, request("DELETE", &location, &[ALICE])).await;
    assert_eq!(cancel.status, StatusCode::ACCEPTED);
    assert_eq!(cancel.json()["execution_id"], json!(id));
    tokio::time::timeout(Duration::from_secs(1), probe.saw_cancellation.notified())
        .await
        .expect("the tool sees the cancellation within 1 s");

    let ended = wait_ended(&router, &location, ALICE).await;
    assert_eq!(ended.status, StatusCode::OK, "the resource exists");
    assert_eq!(ended.json()["status"], "cancelled");
    assert_eq!(ended.json()["error"]["code"], "CANCELLED");
    assert_eq!(ended.json()["execution_id"], json!(id));

    let again = send(&router, request("DELETE", &location, &[ALICE])).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.json()["error"]["code"], "EXECUTION_ENDED");
}

/// Starts `gated` for Alice, detached, once its previous runs (`round` of them) have started;
/// returns its location when the tool waits at its gate.
async fn gated_execution(router: &axum::Router, probe: &Probe, round: u64) -> String {
    let call = json!({ "tool": "gated", "arguments": {} });
    let accepted = start(router, &call, &[ALICE, ASYNC]).await;
    assert_eq!(
        accepted.status,
        StatusCode::ACCEPTED,
        "{:?}",
        accepted.json()
    );
    probe.wait_runs(round + 1).await;
    accepted.header("location").unwrap().to_owned()
}

/// A `DELETE` that arrives as the execution ends: the tool has returned, and the execution has
/// not yet recorded its end. On this single-threaded runtime nothing else runs between the
/// gate opening and the store taking the cancellation, every time.
#[tokio::test]
async fn a_cancellation_that_arrives_as_the_execution_ends_is_409_never_202() {
    let probe = Probe::default();
    let gate = Gate::default();
    let router = app(&probe).state(gate.clone()).router().unwrap();
    for round in 0..20 {
        let location = gated_execution(&router, &probe, round).await;
        // Even rounds: the tool ends on its next poll, and the DELETE comes first. Odd rounds:
        // the tool still waits at its gate, and is cancelled.
        let ending = round % 2 == 0;
        if ending {
            gate.open.notify_waiters();
        }
        let cancel = send(&router, request("DELETE", &location, &[ALICE])).await;
        let ended = wait_ended(&router, &location, ALICE).await;
        let outcome = (cancel.status, ended.json()["status"].clone());
        if ending {
            let expected = (StatusCode::CONFLICT, json!("completed"));
            assert_eq!(outcome, expected, "round {round}: {:?}", cancel.json());
            assert_eq!(cancel.json()["error"]["code"], "EXECUTION_ENDED");
        } else {
            let expected = (StatusCode::ACCEPTED, json!("cancelled"));
            assert_eq!(outcome, expected, "round {round}: {:?}", cancel.json());
            assert_eq!(cancel.json()["execution_id"], ended.json()["execution_id"]);
        }
    }
}

/// Two `DELETE`s race the end of the execution on two threads: whatever wins, a `202` is only
/// ever followed by `cancelled`, a `409` by `completed`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_deletes_never_answer_202_for_an_execution_that_completes() {
    let probe = Probe::default();
    let gate = Gate::default();
    let router = app(&probe).state(gate.clone()).router().unwrap();
    for round in 0..40 {
        let location = gated_execution(&router, &probe, round).await;
        let deletes: Vec<_> = (0..2)
            .map(|_| {
                let router = router.clone();
                let location = location.clone();
                tokio::spawn(
                    async move { send(&router, request("DELETE", &location, &[ALICE])).await },
                )
            })
            .collect();
        gate.open.notify_waiters();
        let mut answers = Vec::new();
        for delete in deletes {
            answers.push(delete.await.unwrap().status);
        }
        let ended = wait_ended(&router, &location, ALICE).await;
        let status = ended.json()["status"].as_str().unwrap().to_owned();
        for answer in &answers {
            let expected = if status == "cancelled" {
                [StatusCode::ACCEPTED, StatusCode::CONFLICT].as_slice()
            } else {
                [StatusCode::CONFLICT].as_slice()
            };
            assert!(
                expected.contains(answer),
                "round {round}: DELETE answered {answer}, the execution ended {status}"
            );
        }
    }
}

/// A lookup answers `200` whatever the outcome (the resource exists; its body says how the call
/// ended); a replay of the call keeps the outcome's status.
#[tokio::test]
async fn a_lookup_is_200_whatever_the_outcome_and_a_replay_keeps_its_status() {
    let router = app(&Probe::default()).router().unwrap();
    for (how, status, code) in [
        ("missing", StatusCode::NOT_FOUND, "ORDER_NOT_FOUND"),
        ("refused", StatusCode::CONFLICT, "OUT_OF_STOCK"),
        ("panicked", StatusCode::INTERNAL_SERVER_ERROR, "TOOL_PANIC"),
        ("late", StatusCode::GATEWAY_TIMEOUT, "TIMEOUT"),
    ] {
        let call = json!({
            "tool": "ends",
            "arguments": { "how": how },
            "request_id": format!("{}-ends-{how}", carmy_tests::run_id()),
        });
        let answer = start(&router, &call, &[ALICE]).await;
        assert_eq!(answer.status, status, "{how}");
        assert_eq!(answer.json()["error"]["code"], code, "{how}");
        let location = format!(
            "/agent/executions/{}",
            answer.json()["execution_id"].as_str().unwrap()
        );
        let lookup = send(&router, request("GET", &location, &[ALICE])).await;
        assert_eq!(lookup.status, StatusCode::OK, "{how}");
        assert_eq!(lookup.body, answer.body, "{how}: the answer, byte for byte");
        assert_eq!(lookup.header("cache-control"), Some("no-store"));

        let replay = start(&router, &call, &[ALICE]).await;
        if how == "late" {
            // A non-idempotent write that timed out is uncertain: never replayed, never rerun.
            assert_eq!(replay.status, StatusCode::CONFLICT);
            assert_eq!(replay.json()["error"]["code"], "EXECUTION_UNCERTAIN");
        } else {
            assert_eq!(replay.status, status, "{how}");
            assert_eq!(replay.header("carmy-replayed"), Some("true"));
            assert_eq!(replay.body, answer.body, "{how}");
        }
    }
    // A missing execution is still 404, told apart from a tool's not-found by the status.
    let missing = send(
        &router,
        request(
            "GET",
            "/agent/executions/exec_01948000-0000-7000-8000-000000000000",
            &[ALICE],
        ),
    )
    .await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json()["error"]["code"], "EXECUTION_NOT_FOUND");
}

#[tokio::test]
async fn the_list_is_the_callers_own_newest_first_a_page_at_a_time() {
    let router = app(&Probe::default()).router().unwrap();
    let mut ids = Vec::new();
    for millis in [0, 0, 5_000] {
        let accepted = start(&router, &chatter(0, millis), &[ALICE, ASYNC]).await;
        ids.push(accepted.json()["execution_id"].as_str().unwrap().to_owned());
    }
    let with_request_id =
        json!({ "tool": "echo", "arguments": { "text": "hi" }, "request_id": "e-1" });
    let sync = start(&router, &with_request_id, &[ALICE]).await;
    ids.push(sync.json()["execution_id"].as_str().unwrap().to_owned());
    // Neither a plain synchronous call nor another caller's execution is listed.
    start(
        &router,
        &json!({ "tool": "echo", "arguments": { "text": "x" } }),
        &[ALICE],
    )
    .await;
    start(&router, &chatter(0, 0), &[BOB, ASYNC]).await;
    start(&router, &chatter(0, 0), &[ROOT, ASYNC]).await;
    wait_ended(&router, &format!("/agent/executions/{}", ids[1]), ALICE).await;

    let first = send(
        &router,
        request("GET", "/agent/executions?limit=3", &[ALICE]),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    let page = first.json();
    let listed: Vec<_> = page["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["execution_id"].as_str().unwrap().to_owned())
        .collect();
    let newest_first: Vec<_> = ids.iter().rev().cloned().collect();
    assert_eq!(listed, newest_first[..3]);
    assert_eq!(page["executions"][0]["tool"], "echo");
    assert_eq!(page["executions"][0]["status"], "completed");
    assert_eq!(page["executions"][1]["status"], "running");
    let cursor = page["next_cursor"].as_str().unwrap();
    let second = send(
        &router,
        request(
            "GET",
            &format!("/agent/executions?limit=3&cursor={cursor}"),
            &[ALICE],
        ),
    )
    .await
    .json();
    assert_eq!(second["executions"].as_array().unwrap().len(), 1);
    assert_eq!(second["executions"][0]["execution_id"], json!(ids[0]));
    assert_eq!(second["next_cursor"], Value::Null);

    let running = get_with(&router, "/agent/executions?status=running", &[ALICE])
        .await
        .json();
    assert_eq!(running["executions"].as_array().unwrap().len(), 1);
    let echoes = get_with(&router, "/agent/executions?tool=echo", &[ALICE])
        .await
        .json();
    assert_eq!(echoes["executions"].as_array().unwrap().len(), 1);
    let anonymous = get(&router, "/agent/executions").await.json();
    assert_eq!(anonymous["executions"], json!([]));

    for (query, parameter) in [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=ten", "limit"),
        ("cursor=abc", "cursor"),
        ("status=done", "status"),
    ] {
        let answer = send(
            &router,
            request("GET", &format!("/agent/executions?{query}"), &[ALICE]),
        )
        .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{query}");
        assert_eq!(answer.json()["error"]["code"], "INVALID_REQUEST", "{query}");
        assert_eq!(
            answer.json()["error"]["details"]["parameter"],
            parameter,
            "{query}"
        );
    }
}

#[tokio::test]
async fn a_tools_mode_decides_whether_it_answers_202() {
    let router = app(&Probe::default()).router().unwrap();
    let call = json!({ "tool": "detached", "arguments": { "reports": 1, "millis": 0 } });
    let always = start(&router, &call, &[ALICE]).await;
    assert_eq!(always.status, StatusCode::ACCEPTED);
    assert_eq!(always.header("preference-applied"), None);
    assert!(always.header("location").is_some());

    let call = json!({ "tool": "attached", "arguments": { "reports": 1, "millis": 0 } });
    let never = start(&router, &call, &[ALICE, ASYNC]).await;
    assert_eq!(never.status, StatusCode::OK);
    assert_eq!(never.header("preference-applied"), None);

    // Other preferences are ignored; respond-async among them applies.
    let call = chatter(0, 0);
    let mixed = start(
        &router,
        &call,
        &[ALICE, ("prefer", "handling=lenient, respond-async; x=1")],
    )
    .await;
    assert_eq!(mixed.status, StatusCode::ACCEPTED);
    let other = start(&router, &call, &[ALICE, ("prefer", "return=minimal")]).await;
    assert_eq!(other.status, StatusCode::OK);

    let catalog = send(&router, request("GET", "/agent/tools", &[ALICE]))
        .await
        .json();
    let mode = |name: &str| {
        catalog["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|tool| tool["name"] == name)
            .map(|tool| tool["mode"].clone())
            .unwrap()
    };
    assert_eq!(mode("detached"), "async");
    assert_eq!(mode("attached"), "sync");
    assert_eq!(mode("chatty"), "either");
}

#[tokio::test]
async fn a_thousand_concurrent_async_starts_with_one_request_id_are_one_execution() {
    let probe = Probe::default();
    let router = app(&probe).router().unwrap();
    let call =
        json!({ "tool": "slow_write", "arguments": { "millis": 300 }, "request_id": "once" });
    let starts = (0..1_000).map(|_| {
        let router = router.clone();
        let call = call.clone();
        tokio::spawn(async move { start(&router, &call, &[ALICE, ASYNC]).await })
    });
    let answers = futures_util::future::join_all(starts).await;
    let mut ids = std::collections::HashSet::new();
    for answer in answers {
        let answer = answer.unwrap();
        assert!(
            matches!(answer.status, StatusCode::ACCEPTED | StatusCode::OK),
            "{answer:?}"
        );
        ids.insert(answer.json()["execution_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids.into_iter().next().unwrap();
    wait_ended(&router, &format!("/agent/executions/{id}"), ALICE).await;
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn an_async_execution_survives_its_client_disconnecting_a_sync_one_does_not() {
    let probe = Probe::default();
    let server = Server::start(app(&probe).router().unwrap()).await;

    // The 202 arrives; the client goes away at once.
    let call = json!({ "tool": "slow_write", "arguments": { "millis": 300 } });
    let (mut sender, connection) = server.connect().await;
    let accepted = sender
        .send_request(execute_request(&call, &[ALICE, ASYNC]))
        .await
        .unwrap();
    assert_eq!(accepted.status(), StatusCode::ACCEPTED);
    let location = accepted.headers()["location"].to_str().unwrap().to_owned();
    drop(sender);
    connection.abort();
    let ended = until(ENDS_WITHIN, "the execution ends", async || {
        let answer = server.get(&location, &[ALICE]).await;
        (answer.json()["status"] != "running").then_some(answer)
    })
    .await;
    assert_eq!(ended.json()["status"], "completed");
    assert_eq!(probe.runs(), 1);

    // A synchronous call of the same tool with a request_id is cancelled by the disconnect.
    let call = json!({ "tool": "slow_write", "arguments": { "millis": 5_000 }, "request_id": "sync-gone" });
    let request = execute_request(&call, &[ALICE]);
    probe.leave_once_it_runs(server.addr, request, 2).await;
    tokio::time::timeout(Duration::from_secs(1), probe.saw_cancellation.notified())
        .await
        .expect("the sync call is cancelled within 1 s");
}

#[tokio::test]
async fn the_testing_client_starts_waits_for_and_cancels_async_calls() {
    let probe = Probe::default();
    let client = carmy::testing::Client::new(app(&probe)).unwrap();
    let alice = Principal::new("alice", TrustLevel::Known);
    let id = client
        .call("chatty", json!({ "reports": 2, "millis": 50 }))
        .principal(alice.clone())
        .start()
        .await
        .expect("accepted");
    let answer = client.wait(&alice, &id).await.expect("alice's execution");
    assert_eq!(answer.data(), &json!({ "reports": 2 }));
    let bob = Principal::new("bob", TrustLevel::Known);
    assert!(client.wait(&bob, &id).await.is_none());

    let id = client
        .call("slow_write", json!({ "millis": 10_000 }))
        .principal(alice.clone())
        .start()
        .await
        .expect("accepted");
    probe.wait_runs(1).await;
    assert!(client.cancel(&alice, &id).await);
    let answer = client.wait(&alice, &id).await.unwrap();
    assert_eq!(answer.error_code(), Some("CANCELLED"));
    assert!(!client.cancel(&alice, &id).await, "it has ended");

    // Anonymous callers own no executions: their calls answer at once.
    let answer = client
        .call("chatty", json!({ "reports": 0, "millis": 0 }))
        .start()
        .await
        .expect_err("answered synchronously");
    assert_eq!(answer.data(), &json!({ "reports": 0 }));
}

/// Two replicas sharing `store_a`'s and `store_b`'s engine: an execution started on A is read,
/// re-attached, listed and cancelled on B; the replica running it learns of the cancellation
/// within 1 s.
async fn across_replicas(store_a: impl Engine, store_b: impl Engine) {
    let (probe_a, probe_b) = (Probe::default(), Probe::default());
    let a = app(&probe_a).store(store_a).router().unwrap();
    let b = app(&probe_b).store(store_b).router().unwrap();

    let accepted = start(&a, &chatter(3, 600), &[ALICE, ASYNC]).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED);
    let id = accepted.json()["execution_id"].as_str().unwrap().to_owned();
    let location = format!("/agent/executions/{id}");
    let running = send(&b, request("GET", &location, &[ALICE])).await;
    assert_eq!(running.status, StatusCode::OK);
    assert_eq!(running.json()["status"], "running");
    assert_eq!(
        send(&b, request("GET", &location, &[BOB])).await.status,
        StatusCode::NOT_FOUND
    );
    let listed = get_with(&b, "/agent/executions?limit=100&status=running", &[ALICE])
        .await
        .json();
    assert!(
        listed["executions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|entry| entry["execution_id"] == json!(id)),
        "{listed}"
    );

    // Re-attached on B while A runs it: to the end, with the ids A gave the events.
    let events = send(&b, request("GET", &format!("{location}/events"), &[ALICE])).await;
    let events: Vec<_> = parse_sse(std::str::from_utf8(&events.body).unwrap())
        .into_iter()
        .filter(|event| !event.comment)
        .collect();
    let names: Vec<_> = events
        .iter()
        .map(|event| (event.event.clone().unwrap(), event.id.clone().unwrap()))
        .collect();
    let expected: Vec<(String, String)> = [
        ("execution.started", "1"),
        ("tool.progress", "2"),
        ("tool.progress", "3"),
        ("tool.progress", "4"),
        ("execution.completed", "5"),
    ]
    .iter()
    .map(|(name, id)| ((*name).to_owned(), (*id).to_owned()))
    .collect();
    assert_eq!(names, expected);
    let on_a = send(&a, request("GET", &location, &[ALICE])).await;
    let on_b = send(&b, request("GET", &location, &[ALICE])).await;
    assert_eq!(on_a.body, on_b.body);
    assert_eq!(on_b.json()["data"], json!({ "reports": 3 }));
    assert_eq!(probe_b.runs(), 0);

    // Cancelled on B, run on A.
    let call = json!({ "tool": "slow_write", "arguments": { "millis": 10_000 } });
    let accepted = start(&a, &call, &[ALICE, ASYNC]).await;
    let id = accepted.json()["execution_id"].as_str().unwrap().to_owned();
    let location = format!("/agent/executions/{id}");
    probe_a.wait_runs(1).await;
    let cancel = send(&b, request("DELETE", &location, &[BOB])).await;
    assert_eq!(
        cancel.status,
        StatusCode::NOT_FOUND,
        "another caller cancels nothing"
    );
    let cancel = send(&b, request("DELETE", &location, &[ALICE])).await;
    assert_eq!(cancel.status, StatusCode::ACCEPTED);
    tokio::time::timeout(Duration::from_secs(1), probe_a.saw_cancellation.notified())
        .await
        .expect("the running replica learns of the cancellation within 1 s");
    let ended = wait_ended(&b, &location, ALICE).await;
    assert_eq!(ended.json()["status"], "cancelled");

    // 1,000 concurrent async starts of one request_id, half on each replica: one execution.
    // (A tool with a 30 s deadline: under this load, waiting for the store's connections
    // counts against the deadline.)
    let mut call = chatter(1, 300);
    call["request_id"] = json!(format!("once-{}", carmy_tests::run_id()));
    let starts = (0..1_000).map(|n| {
        let router = if n % 2 == 0 { a.clone() } else { b.clone() };
        let call = call.clone();
        tokio::spawn(async move { start(&router, &call, &[ALICE, ASYNC]).await })
    });
    let mut ids = std::collections::HashSet::new();
    for answer in futures_util::future::join_all(starts).await {
        let answer = answer.unwrap();
        assert!(
            matches!(answer.status, StatusCode::ACCEPTED | StatusCode::OK),
            "{answer:?}"
        );
        ids.insert(answer.json()["execution_id"].as_str().unwrap().to_owned());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids.into_iter().next().unwrap();
    let ended = wait_ended(&b, &format!("/agent/executions/{id}"), ALICE).await;
    assert_eq!(ended.json()["status"], "completed", "{}", ended.json());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_across_two_replicas_on_postgres() {
    let Some(url) = carmy_tests::server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let a = PostgresStore::connect(&url).await.unwrap();
    let b = PostgresStore::connect(&url).await.unwrap();
    across_replicas(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_across_two_replicas_on_redis() {
    let Some(url) = carmy_tests::server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    let a = RedisStore::connect(&url).await.unwrap();
    let b = RedisStore::connect(&url).await.unwrap();
    across_replicas(a, b).await;
}
