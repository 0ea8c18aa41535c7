//! Several server processes sharing one store: a request id runs once across replicas, and a
//! replica killed mid-write leaves an uncertain record, never a second execution. Each replica
//! is the `replica` binary of this package; its tool's side effect is a row in a PostgreSQL
//! table, counted here. Needs `CARMY_TEST_POSTGRES_URL` for that ledger whatever the store (and
//! `CARMY_TEST_REDIS_URL` for the Redis runs); skipped with a printed reason without them.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use axum::http::StatusCode;
use carmy_tests::wait::{PATIENCE, eventually, within};
use carmy_tests::{execute_at, needs, postgres, run_id, server_url};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A running replica process; killed when dropped.
struct Replica {
    addr: SocketAddr,
    child: Child,
}

impl Replica {
    async fn start(store_url: &str, effects_url: &str) -> Replica {
        let mut child = Command::new(env!("CARGO_BIN_EXE_replica"))
            .env("CARMY_IDEMPOTENCY_URL", store_url)
            .env("REPLICA_EFFECTS_URL", effects_url)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the replica binary starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the replica starts in time")
            .expect("stdout reads")
            .expect("the replica printed its address");
        let addr = line
            .strip_prefix("listening on ")
            .and_then(|addr| addr.parse().ok())
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        Replica { addr, child }
    }

    /// `kill -9`: no chance to record anything.
    async fn kill(mut self) {
        self.child.kill().await.expect("SIGKILL");
    }
}

/// PostgreSQL as the store under test.
const POSTGRES: &str = "CARMY_TEST_POSTGRES_URL";
/// Redis as the store under test.
const REDIS: &str = "CARMY_TEST_REDIS_URL";
/// PostgreSQL as the ledger of the tool's side effects, whatever the store.
const EFFECTS: &str = "CARMY_TEST_POSTGRES_URL (the effects ledger)";

fn call(request_id: &str, marker: &str, hold_ms: u64) -> Value {
    json!({
        "tool": "record_effect",
        "arguments": { "marker": marker, "hold_ms": hold_ms },
        "request_id": request_id,
    })
}

/// How many times the write with `marker` took effect, read from the shared table.
async fn effects(effects_url: &str, marker: &str) -> i64 {
    postgres::client(effects_url)
        .await
        .query_one(
            "SELECT count(*) FROM carmy_test_effects WHERE marker = $1",
            &[&marker],
        )
        .await
        .expect("the effects table exists")
        .get(0)
}

/// 200 concurrent calls with one request id, spread over two replicas: one execution, one
/// body for everyone.
async fn one_execution_across_two_replicas(store_url: &str, effects_url: &str, name: &str) {
    let replicas = [
        Replica::start(store_url, effects_url).await,
        Replica::start(store_url, effects_url).await,
    ];
    let marker = format!("{}-{name}", run_id());
    let body = call(&marker, &marker, 200);
    let calls: Vec<_> = (0..200)
        .map(|index| {
            let addr = replicas[index % 2].addr;
            let body = body.clone();
            tokio::spawn(async move { execute_at(addr, &body).await })
        })
        .collect();
    let mut bodies = Vec::new();
    for call in calls {
        let answer = call.await.unwrap();
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
        bodies.push(answer.body);
    }
    assert!(
        bodies.iter().all(|body| *body == bodies[0]),
        "every caller gets the same body"
    );
    assert_eq!(
        effects(effects_url, &marker).await,
        1,
        "exactly one execution"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_postgres_run_a_request_once() {
    let Some(postgres) = server_url(POSTGRES) else {
        return;
    };
    one_execution_across_two_replicas(&postgres, &postgres, "postgres-replicas").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_redis_run_a_request_once() {
    let Some([redis, postgres]) = needs([REDIS, EFFECTS]) else {
        return;
    };
    one_execution_across_two_replicas(&redis, &postgres, "redis-replicas").await;
}

/// Waits until the write with `marker` has landed (the tool is now holding on).
async fn until_written(effects_url: &str, marker: &str) {
    eventually(PATIENCE, "the write lands", async || {
        effects(effects_url, marker).await > 0
    })
    .await;
}

/// A retry of a write whose replica died mid-run: `409 EXECUTION_UNCERTAIN` naming the first
/// execution, never a second run.
async fn assert_uncertain(answer: &carmy_tests::Answer) {
    assert_eq!(answer.status, StatusCode::CONFLICT, "{}", answer.json());
    let body = answer.json();
    assert_eq!(body["error"]["code"], "EXECUTION_UNCERTAIN");
    let first = body["error"]["details"]["execution_id"].as_str().unwrap();
    assert!(first.starts_with("exec_"), "{body}");
    assert_ne!(
        body["execution_id"], first,
        "the retry is another execution"
    );
}

/// `kill -9` of the replica running a write; the retry goes to the other one.
async fn a_crash_mid_write_leaves_it_uncertain(store_url: &str, effects_url: &str, name: &str) {
    let first = Replica::start(store_url, effects_url).await;
    let second = Replica::start(store_url, effects_url).await;
    let marker = format!("{}-{name}", run_id());
    let body = call(&marker, &marker, 4_800);
    let addr = first.addr;
    let running = {
        let body = body.clone();
        tokio::spawn(async move { execute_at(addr, &body).await })
    };
    until_written(effects_url, &marker).await;
    // Past the lease margin, so the retry's own deadline outlasts the dead execution's lease.
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.kill().await;
    running.abort();
    let retry = execute_at(second.addr, &body).await;
    assert_uncertain(&retry).await;
    // And so it stays, on either path to the store.
    assert_uncertain(&execute_at(second.addr, &body).await).await;
    assert_eq!(
        effects(effects_url, &marker).await,
        1,
        "never a second execution"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_write_leaves_it_uncertain_with_postgres() {
    let Some(postgres) = server_url(POSTGRES) else {
        return;
    };
    a_crash_mid_write_leaves_it_uncertain(&postgres, &postgres, "postgres-crash").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_write_leaves_it_uncertain_with_redis() {
    let Some([redis, postgres]) = needs([REDIS, EFFECTS]) else {
        return;
    };
    a_crash_mid_write_leaves_it_uncertain(&redis, &postgres, "redis-crash").await;
}

/// A store file for this run, and its `CARMY_IDEMPOTENCY_URL`.
fn store_file(name: &str) -> (std::path::PathBuf, String) {
    let path = std::env::temp_dir().join(format!("carmy-{}-{name}.redb", run_id()));
    let url = format!("file:{}", path.display());
    (path, url)
}

/// The file store across restarts: a finished call replays after a `kill -9` and restart, and
/// a call interrupted by the crash is uncertain once its lease has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_store_remembers_across_a_crash_and_restart() {
    let Some(postgres) = server_url(EFFECTS) else {
        return;
    };
    let (path, store_url) = store_file("replica");
    let finished = format!("{}-file-finished", run_id());
    let interrupted = format!("{}-file-interrupted", run_id());

    let replica = Replica::start(&store_url, &postgres).await;
    let first = execute_at(replica.addr, &call(&finished, &finished, 0)).await;
    assert_eq!(first.status, StatusCode::OK);
    let addr = replica.addr;
    let running = tokio::spawn({
        let body = call(&interrupted, &interrupted, 4_800);
        async move { execute_at(addr, &body).await }
    });
    until_written(&postgres, &interrupted).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    replica.kill().await;
    running.abort();

    let restarted = Replica::start(&store_url, &postgres).await;
    let replay = execute_at(restarted.addr, &call(&finished, &finished, 0)).await;
    assert_eq!(replay.status, StatusCode::OK);
    assert_eq!(replay.header("carmy-replayed"), Some("true"));
    assert_eq!(replay.body, first.body);
    assert_uncertain(&execute_at(restarted.addr, &call(&interrupted, &interrupted, 4_800)).await)
        .await;
    assert_eq!(effects(&postgres, &finished).await, 1);
    assert_eq!(effects(&postgres, &interrupted).await, 1);
    drop(restarted);
    let _ = std::fs::remove_file(&path);
}

/// Group commit keeps its promise under load: with 200 calls in flight (their writes sharing
/// transactions), the process is killed; after a restart, every call that was answered
/// replays its answer and ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_store_keeps_every_answered_call_of_a_crash_under_load() {
    let Some(postgres) = server_url(EFFECTS) else {
        return;
    };
    let (path, store_url) = store_file("group");
    let replica = Replica::start(&store_url, &postgres).await;
    let (answered, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let addr = replica.addr;
    let calls: Vec<_> = (0..200)
        .map(|index| {
            let marker = format!("{}-group-{index}", run_id());
            let answered = answered.clone();
            tokio::spawn(async move {
                let answer = execute_at(addr, &call(&marker, &marker, 0)).await;
                if answer.status == StatusCode::OK {
                    let _ = answered.send((marker, answer.body));
                }
            })
        })
        .collect();
    // Killed while the calls are still coming in.
    let mut before_the_crash = Vec::new();
    within(PATIENCE, "50 calls answered", async {
        while before_the_crash.len() < 50 {
            before_the_crash.push(answers.recv().await.expect("calls are answered"));
        }
    })
    .await;
    replica.kill().await;
    for call in calls {
        // A call cut off by the crash fails in its client: it was never answered.
        let _ = call.await;
    }
    drop(answered);
    while let Some(answer) = answers.recv().await {
        before_the_crash.push(answer);
    }

    let restarted = Replica::start(&store_url, &postgres).await;
    for (marker, body) in &before_the_crash {
        let replay = execute_at(restarted.addr, &call(marker, marker, 0)).await;
        assert_eq!(replay.status, StatusCode::OK, "{}", replay.json());
        assert_eq!(replay.header("carmy-replayed"), Some("true"), "{marker}");
        assert_eq!(&replay.body, body, "{marker}");
        assert_eq!(effects(&postgres, marker).await, 1, "{marker} ran once");
    }
    drop(restarted);
    let _ = std::fs::remove_file(&path);
}
