//! Webhooks from the durable outbox (`protocol.md` §8), end to end with the example server as
//! shipped (`CARMY_SHOP_BIN`): events written while the receiver is down survive a `kill -9` and
//! are delivered after the restart, once per `webhook-id`; two replicas on one store make each
//! attempt once; and the official Standard Webhooks verifier (`tests/webhooks-verify/`, in the
//! virtualenv `CARMY_WEBHOOKS_PYTHON` names) accepts every signature, dual ones after a rotation
//! too. Each run keeps its outbox in a namespace of its own (a PostgreSQL schema, a Redis
//! database, a file), so no other test's deliveries mix in. Without the variables the tests
//! say so and pass; with `CARMY_REQUIRE_SERVICES` set (`.ci/run`) a missing one fails.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use carmy_tests::wait::{PATIENCE, within};
use carmy_tests::{Answer, TempDir, needs, postgres, redis_database, run_id, send_to, server_url};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The example's internal token (`examples/shop/carmy.toml`): manages subscriptions.
const INTERNAL_TOKEN: &str = "shop-internal-demo-token";
const INTERNAL_TOKEN_HASH: &str =
    "sha256:5d17fbe884a2faee0db80941cbf6e1ba59f0b25a0a305e8284394e0d3046e437";

/// Retries come quickly, and a claim held by a killed server lapses after 5 s + the worker's
/// 10 s margin: every wait below stays well under a minute.
const CONFIG: &str = r#"
[[tokens]]
id = "shop-assistant"
trust = "internal"
hash = "HASH"

[events]
retry_schedule = ["500ms", "1s", "1s"]
attempt_timeout = "5s"
"#;

/// Longer than a claim's lease (15 s) plus the retries, bounded.
const DELIVERED_WITHIN: Duration = Duration::from_secs(40);
/// After the last expected delivery, how long a duplicate has to show up: the worker polls
/// every 500 ms and the first retry comes after about 500 ms.
const SETTLE: Duration = Duration::from_secs(2);

/// `carmy.toml` for the test servers, in a directory of its own.
struct TestConfig {
    dir: TempDir,
}

impl TestConfig {
    fn new(name: &str) -> Self {
        let dir = TempDir::new(&format!("webhooks-{name}"));
        std::fs::write(
            dir.0.join("carmy.toml"),
            CONFIG.replace("HASH", INTERNAL_TOKEN_HASH),
        )
        .unwrap();
        TestConfig { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.0.join("carmy.toml")
    }
}

/// The example server on a loopback port, its events allowed to loopback receivers; killed
/// (`SIGKILL`) when dropped.
struct Shop {
    addr: SocketAddr,
    child: Child,
}

impl Shop {
    async fn start(program: &str, store_url: &str, config: &Path) -> Shop {
        let addr = free_port();
        let child = Command::new(program)
            .env("CARMY_ADDR", addr.to_string())
            .env("CARMY_IDEMPOTENCY_URL", store_url)
            .env("CARMY_CONFIG", config)
            .env("CARMY_EVENTS_ALLOW_HTTP", "true")
            .env("CARMY_EVENTS_ALLOW_NETWORKS", "127.0.0.0/8")
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| panic!("{program} cannot start: {error}"));
        let mut shop = Shop { addr, child };
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return shop;
            }
            if let Some(status) = shop.child.try_wait().unwrap() {
                panic!("the shop exited before it listened: {status}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the shop did not listen on {addr} within 15 s");
    }

    /// `kill -9`: no chance to finish an attempt or record anything.
    async fn kill(mut self) {
        self.child.kill().await.expect("SIGKILL");
    }

    async fn send(&self, method: &str, path: &str, body: Option<&Value>) -> Answer {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr.to_string())
            .header("authorization", format!("Bearer {INTERNAL_TOKEN}"));
        let request = match body {
            Some(body) => request
                .header("content-type", "application/json")
                .body(Body::from(body.to_string())),
            None => request.body(Body::empty()),
        };
        send_to(self.addr, request.unwrap()).await
    }

    /// Subscribes `url` to `execution.finished`: its id and secret.
    async fn subscribe(&self, url: &str) -> (String, String) {
        let body = json!({ "url": url, "event_types": ["execution.finished"] });
        let created = self
            .send("POST", "/agent/events/subscriptions", Some(&body))
            .await;
        assert_eq!(created.status, StatusCode::CREATED, "{}", created.json());
        let created = created.json();
        let field = |name: &str| created[name].as_str().unwrap().to_owned();
        (field("id"), field("secret"))
    }

    async fn unsubscribe(&self, id: &str) {
        let path = format!("/agent/events/subscriptions/{id}");
        let deleted = self.send("DELETE", &path, None).await;
        assert!(deleted.status.is_success(), "{}", deleted.status);
    }

    /// An order with a request id, so its execution is kept and announced: the execution id.
    async fn order(&self, request_id: &str) -> String {
        let body = json!({
            "tool": "create_order",
            "arguments": { "sku": "KB-01" },
            "request_id": request_id,
        });
        let answer = self.send("POST", "/agent/execute", Some(&body)).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
        answer.json()["execution_id"].as_str().unwrap().to_owned()
    }

    /// The attempts logged for a subscription, newest first.
    async fn attempts(&self, subscription: &str) -> Vec<Value> {
        let path = format!("/agent/events/subscriptions/{subscription}/deliveries");
        let listed = self.send("GET", &path, None).await;
        assert_eq!(listed.status, StatusCode::OK, "{}", listed.json());
        listed.json()["deliveries"].as_array().unwrap().clone()
    }
}

/// A loopback address nothing listens on (until a test binds it).
fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap()
}

/// What a receiver has been sent.
#[derive(Debug, Default)]
struct Received {
    /// Requests per `webhook-id`.
    attempts: HashMap<String, u32>,
    /// The `webhook-id`s announcing each execution.
    executions: HashMap<String, HashSet<String>>,
}

struct ReceiverState {
    received: Mutex<Received>,
    /// Answers each `webhook-id`'s first request with `503`, as a receiver having a moment.
    refuse_first: bool,
}

/// A webhook receiver on a loopback port, counting requests per `webhook-id`.
struct Receiver {
    state: Arc<ReceiverState>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start(addr: SocketAddr, refuse_first: bool) -> Receiver {
        let state = Arc::new(ReceiverState {
            received: Mutex::default(),
            refuse_first,
        });
        let router = axum::Router::new()
            .route("/hook", axum::routing::post(receive))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("the receiver's port is free");
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        Receiver { state, task }
    }

    /// Waits until every execution of `expected` has been announced with a success.
    async fn until_announced(&self, expected: &HashSet<String>) {
        let deadline = tokio::time::Instant::now() + DELIVERED_WITHIN;
        let needed = if self.state.refuse_first { 2 } else { 1 };
        loop {
            let missing = {
                let received = self.state.received.lock().unwrap();
                expected
                    .iter()
                    .filter(|execution| {
                        received
                            .executions
                            .get(*execution)
                            .is_none_or(|ids| ids.iter().all(|id| received.attempts[id] < needed))
                    })
                    .count()
            };
            if missing == 0 {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{missing} of {} executions not delivered within {DELIVERED_WITHIN:?}",
                expected.len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Each execution of `expected` was announced by one event, and nothing else arrived; each
    /// event's requests, by `webhook-id`.
    fn announcements(&self, expected: &HashSet<String>) -> Vec<u32> {
        let received = self.state.received.lock().unwrap();
        let announced: HashSet<String> = received.executions.keys().cloned().collect();
        assert_eq!(&announced, expected, "every execution, and only those");
        for (execution, ids) in &received.executions {
            assert_eq!(ids.len(), 1, "{execution} announced by one event: {ids:?}");
        }
        received.attempts.values().copied().collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let id = headers["webhook-id"].to_str().unwrap().to_owned();
    let event: Value = serde_json::from_slice(&body).unwrap();
    let mut received = state.received.lock().unwrap();
    let attempts = received.attempts.entry(id.clone()).or_default();
    *attempts += 1;
    let first = *attempts == 1;
    if let Some(execution) = event["data"]["execution_id"].as_str() {
        received
            .executions
            .entry(execution.to_owned())
            .or_default()
            .insert(id);
    }
    if state.refuse_first && first {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

/// Orders placed, with request ids: their execution ids.
async fn orders(shop: &Shop, name: &str, count: usize) -> HashSet<String> {
    let mut executions = HashSet::new();
    for index in 0..count {
        let request_id = format!("{}-{name}-{index}", run_id());
        executions.insert(shop.order(&request_id).await);
    }
    executions
}

/// How the receiver is down while the server crashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Down {
    /// Nothing listens: every attempt fails at once, and the outbox holds the retries.
    Refusing,
    /// It accepts connections and never answers: every delivery is claimed, its attempt in
    /// flight, when the server dies; only once the claim's lease passes may it be tried again.
    Hanging,
}

/// Accepts connections on `addr` and holds them, never answering; counts them.
async fn hang(addr: SocketAddr) -> (tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&accepted);
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    (task, accepted)
}

/// Calls made while the receiver is down; `kill -9` of the server; the receiver comes up; the
/// server restarts on the same store and delivers every event, exactly once.
async fn events_survive_a_crash(program: &str, store_url: &str, name: &str, down: Down) {
    const CALLS: usize = 8;
    let config = TestConfig::new(name);
    let receiver_addr = free_port();
    let hanging = match down {
        Down::Refusing => None,
        Down::Hanging => Some(hang(receiver_addr).await),
    };
    let shop = Shop::start(program, store_url, &config.path()).await;
    let (subscription, _secret) = shop
        .subscribe(&format!("http://{receiver_addr}/hook"))
        .await;
    let executions = orders(&shop, name, CALLS).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let attempts = shop.attempts(&subscription).await;
        let tried: HashSet<&str> = attempts
            .iter()
            .filter_map(|attempt| attempt["event_id"].as_str())
            .collect();
        let ready = match &hanging {
            // Every event has been tried, and refused: the outbox holds retries.
            None => {
                assert!(
                    attempts
                        .iter()
                        .all(|attempt| attempt["status_code"].is_null()),
                    "nothing can answer: {attempts:?}"
                );
                tried.len() == CALLS
            }
            // Every event's first attempt is waiting for an answer.
            Some((_, accepted)) => {
                assert!(tried.is_empty(), "no attempt has ended: {attempts:?}");
                accepted.load(Ordering::SeqCst) >= CALLS
            }
        };
        if ready {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not every event was tried within 10 s: {attempts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shop.kill().await;
    if let Some((task, _)) = hanging {
        task.abort();
        let _ = task.await;
    }

    let receiver = Receiver::start(receiver_addr, false).await;
    let shop = Shop::start(program, store_url, &config.path()).await;
    // A shared store keeps the dead server's claims for 5 s + 10 s from its attempts: not
    // retaken yet. The file store, open in one process at a time, need not keep a claim past
    // a crash (`FileStore::claim_deliveries`): there they may be delivered at once.
    if down == Down::Hanging && !store_url.starts_with("file:") {
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            receiver.state.received.lock().unwrap().attempts.is_empty(),
            "a claim was taken over before its lease passed"
        );
    }
    receiver.until_announced(&executions).await;
    tokio::time::sleep(SETTLE).await;
    let attempts = receiver.announcements(&executions);
    assert!(
        attempts.iter().all(|&count| count == 1),
        "each webhook-id delivered once: {attempts:?}"
    );
    shop.unsubscribe(&subscription).await;
}

/// The PostgreSQL schema of the run `name`: created by [`postgres::schema`], and the store
/// migrates it.
fn schema_of(name: &str) -> String {
    format!("carmy_webhooks_{name}_{}", run_id())
}

async fn with_postgres(name: &str, down: Down) {
    let Some([url, program]) = needs(["CARMY_TEST_POSTGRES_URL", "CARMY_SHOP_BIN"]) else {
        return;
    };
    let scoped = postgres::schema(&url, &schema_of(name)).await;
    events_survive_a_crash(&program, &scoped, name, down).await;
    postgres::drop_schema(&url, &schema_of(name)).await;
}

/// A Redis database of its own, at `url`, rid of the subscriptions an interrupted earlier run
/// left behind (they would be sent these events too): its URL.
async fn redis_of_its_own(url: &str, database: u32) -> String {
    let scoped = redis_database(url, database);
    let store = carmy::store::connect(&scoped).await.unwrap();
    for left in store.subscriptions().await.unwrap() {
        store.delete_subscription(&left.id).await.unwrap();
    }
    scoped
}

async fn with_redis(database: u32, down: Down) {
    let Some([url, program]) = needs(["CARMY_TEST_REDIS_URL", "CARMY_SHOP_BIN"]) else {
        return;
    };
    let scoped = redis_of_its_own(&url, database).await;
    events_survive_a_crash(&program, &scoped, &format!("redis{database}"), down).await;
}

async fn with_the_file_store(name: &str, down: Down) {
    let Some(program) = server_url("CARMY_SHOP_BIN") else {
        return;
    };
    let dir = TempDir::new(&format!("webhooks-{name}-store"));
    let store_url = format!("file:{}", dir.0.join("carmy.redb").display());
    events_survive_a_crash(&program, &store_url, name, down).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_events_outlive_a_crash_and_are_delivered_once_with_postgres() {
    with_postgres("pg_refused", Down::Refusing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_in_flight_at_a_crash_are_delivered_once_after_the_lease_with_postgres() {
    with_postgres("pg_in_flight", Down::Hanging).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_events_outlive_a_crash_and_are_delivered_once_with_redis() {
    with_redis(11, Down::Refusing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_in_flight_at_a_crash_are_delivered_once_after_the_lease_with_redis() {
    with_redis(12, Down::Hanging).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_events_outlive_a_crash_and_are_delivered_once_with_the_file_store() {
    with_the_file_store("file-refused", Down::Refusing).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_in_flight_at_a_crash_are_delivered_once_after_the_restart_with_the_file_store() {
    with_the_file_store("file-in-flight", Down::Hanging).await;
}

/// Two servers on one outbox, the calls spread over both, a receiver that answers each event's
/// first attempt with `503` and its retry with `200`: every event arrives exactly twice (each
/// `webhook-id` delivered once), so no attempt was made by both replicas and none was lost.
async fn replicas_make_each_attempt_once(program: &str, store_url: &str, name: &str) {
    const CALLS: usize = 40;
    let config = TestConfig::new(name);
    let receiver_addr = free_port();
    let receiver = Receiver::start(receiver_addr, true).await;
    let first = Shop::start(program, store_url, &config.path()).await;
    let (subscription, _secret) = first
        .subscribe(&format!("http://{receiver_addr}/hook"))
        .await;
    // Started once the subscription is in the store, the other replica reads it there when it
    // first publishes an event.
    let replicas = [first, Shop::start(program, store_url, &config.path()).await];
    let calls: Vec<_> = (0..CALLS)
        .map(|index| {
            let replica = &replicas[index % 2];
            let request_id = format!("{}-{name}-{index}", run_id());
            async move { replica.order(&request_id).await }
        })
        .collect();
    let executions: HashSet<String> = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .collect();
    assert_eq!(executions.len(), CALLS);
    receiver.until_announced(&executions).await;
    tokio::time::sleep(SETTLE).await;
    let attempts = receiver.announcements(&executions);
    assert!(
        attempts.iter().all(|&count| count == 2),
        "each webhook-id refused once, then delivered once: {attempts:?}"
    );
    replicas[0].unsubscribe(&subscription).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_postgres_make_each_attempt_once() {
    let Some([url, program]) = needs(["CARMY_TEST_POSTGRES_URL", "CARMY_SHOP_BIN"]) else {
        return;
    };
    let scoped = postgres::schema(&url, &schema_of("replicas")).await;
    replicas_make_each_attempt_once(&program, &scoped, "pg-replicas").await;
    postgres::drop_schema(&url, &schema_of("replicas")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_one_redis_make_each_attempt_once() {
    let Some([url, program]) = needs(["CARMY_TEST_REDIS_URL", "CARMY_SHOP_BIN"]) else {
        return;
    };
    let scoped = redis_of_its_own(&url, 13).await;
    replicas_make_each_attempt_once(&program, &scoped, "redis-replicas").await;
}

/// `tests/webhooks-verify/receiver.py`, driven over its stdin and stdout.
struct Verifier {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
}

const VERIFIER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/webhooks-verify");

impl Verifier {
    /// Starts it: the URL it receives deliveries on.
    async fn start(python: &str) -> (Verifier, String) {
        let mut child = Command::new(python)
            .arg("receiver.py")
            .current_dir(VERIFIER)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|error| panic!("{python} cannot start: {error}"));
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut verifier = Verifier {
            child,
            stdin,
            lines,
        };
        let line = verifier.line().await;
        let url = line
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("unexpected first line: {line}"))
            .to_owned();
        (verifier, url)
    }

    /// Its next line; fails the test when it has exited or says nothing for 20 s.
    async fn line(&mut self) -> String {
        let next = tokio::time::timeout(Duration::from_secs(20), self.lines.next_line())
            .await
            .expect("the verifier answers in time")
            .unwrap();
        match next {
            Some(line) => line,
            None => panic!("the verifier exited: {:?}", self.child.wait().await),
        }
    }

    /// From now on every delivery must verify with each of `secrets`.
    async fn require(&mut self, secrets: &[&str]) {
        let command = format!("secrets {}\n", secrets.join(" "));
        self.stdin.write_all(command.as_bytes()).await.unwrap();
        assert_eq!(self.line().await, format!("secrets {}", secrets.len()));
    }

    /// Waits for `count` verified deliveries: their `webhook-id`s.
    async fn verified(&mut self, count: usize, secrets: usize) -> Vec<String> {
        let mut ids = Vec::new();
        while ids.len() < count {
            let line = self.line().await;
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["verified", id, "execution.finished", keys] => {
                    assert_eq!(keys, secrets.to_string(), "{line}");
                    ids.push(id.to_owned());
                }
                _ => panic!("the verifier refused a delivery: {line}"),
            }
        }
        ids
    }

    /// Closes its stdin: it reports how many deliveries it verified, and exits 0.
    async fn finish(mut self) -> String {
        drop(self.stdin);
        let mut rest = Vec::new();
        let status = within(PATIENCE, "the verifier exits", async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                rest.push(line);
            }
            self.child.wait().await.unwrap()
        })
        .await;
        assert!(status.success(), "{status}: {rest:?}");
        rest.join("\n")
    }
}

/// The official Standard Webhooks library (`standardwebhooks` from PyPI) verifies real
/// deliveries: signed with the secret the `201` showed, and after `rotate-secret` signed with
/// both the new secret and the old one (each verifying on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_verifier_accepts_every_delivery_also_after_a_rotation() {
    const CALLS: usize = 3;
    let Some([python, program, url]) = needs([
        "CARMY_WEBHOOKS_PYTHON",
        "CARMY_SHOP_BIN",
        "CARMY_TEST_POSTGRES_URL (the outbox)",
    ]) else {
        return;
    };
    let scoped = postgres::schema(&url, &schema_of("verifier")).await;
    let config = TestConfig::new("verifier");
    let (mut verifier, hook) = Verifier::start(&python).await;
    let shop = Shop::start(&program, &scoped, &config.path()).await;
    let (subscription, first) = shop.subscribe(&hook).await;
    assert!(first.starts_with("whsec_"), "{first}");
    verifier.require(&[&first]).await;
    orders(&shop, "verifier-before", CALLS).await;
    let before = verifier.verified(CALLS, 1).await;

    let rotate = format!("/agent/events/subscriptions/{subscription}/rotate-secret");
    let rotated = shop.send("POST", &rotate, None).await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.json());
    let second = rotated.json()["secret"].as_str().unwrap().to_owned();
    assert_ne!(second, first);
    verifier.require(&[&first, &second]).await;
    orders(&shop, "verifier-after", CALLS).await;
    let after = verifier.verified(CALLS, 2).await;

    let distinct: HashSet<&String> = before.iter().chain(&after).collect();
    assert_eq!(distinct.len(), 2 * CALLS, "{before:?} {after:?}");
    assert_eq!(verifier.finish().await, format!("done {}", 2 * CALLS));
    shop.unsubscribe(&subscription).await;
    drop(shop);
    postgres::drop_schema(&url, &schema_of("verifier")).await;
}
