//! Signed outbound event webhooks (`protocol.md` §8), end to end: subscriptions managed through
//! `/agent/events/subscriptions`, events delivered to real receivers on loopback and verified
//! as a Standard Webhooks consumer would, retries, `410 Gone`, rotation, the SSRF guard at
//! creation, subscriptions declared in `carmy.toml`, and health and catalog changes.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use carmy::auth::hash_token;
use carmy::webhook::SigningSecret;
use carmy::webhook::verify;
use carmy::store::Engine;
use carmy_tests::{Answer, Server, TempDir, bearer, execute_as, execute_request, send, server_url};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::tools::{self, Probe};

/// `internal`.
pub(crate) const ROOT: &str = "root-token";
/// `known`, with `manage:events`.
const MANAGER: &str = "manager-token";
/// `known`, without it.
pub(crate) const PLAIN: &str = "plain-token";

pub(crate) const SUBSCRIPTIONS: &str = "/agent/events/subscriptions";

/// The generous bound of "eventually delivered": the worker polls every half second.
const DELIVERED_WITHIN: Duration = Duration::from_secs(15);

fn tokens() -> String {
    format!(
        "[[tokens]]\nid = \"root\"\ntrust = \"internal\"\nhash = \"{}\"\n\n\
         [[tokens]]\nid = \"manager\"\ntrust = \"known\"\nhash = \"{}\"\npermissions = [\"manage:events\"]\n\n\
         [[tokens]]\nid = \"plain\"\ntrust = \"known\"\nhash = \"{}\"\n",
        hash_token(ROOT),
        hash_token(MANAGER),
        hash_token(PLAIN)
    )
}

/// An `[events]` table for receivers on loopback, retrying on `schedule` (extra keys and
/// `[[events.subscriptions]]` after it).
pub(crate) fn events_table(schedule: &[&str], extra: &str) -> String {
    let schedule: Vec<String> = schedule
        .iter()
        .map(|delay| format!("\"{delay}\""))
        .collect();
    format!(
        "[events]\nallow_http = true\nallow_networks = [\"127.0.0.0/8\"]\nretry_schedule = [{}]\n{extra}",
        schedule.join(", ")
    )
}

/// The short schedule most tests use.
const SHORT: &[&str] = &["200ms", "400ms"];

/// The store a test's app keeps its outbox in: PostgreSQL, in a schema of the test's own (each
/// app's worker delivers everything in its outbox, so two tests must never share one). `None`
/// (the test is skipped) without `CARMY_TEST_POSTGRES_URL`.
pub(crate) async fn postgres(test: &str) -> Option<Arc<dyn Engine>> {
    let url = server_url("CARMY_TEST_POSTGRES_URL")?;
    let scoped = carmy_tests::postgres::fresh_schema(&url, &format!("webhooks_{test}")).await;
    Some(carmy::store::connect(&scoped).await.unwrap())
}

/// The store of the tests that do not name one: the memory store, the example's default.
#[expect(clippy::unused_async, reason = "the same shape as `postgres`")]
async fn store(_test: &str) -> Option<Arc<dyn Engine>> {
    Some(Arc::new(carmy::store::MemoryStore::new()))
}

/// An app with the test tools, `tokens()` and `events` (no `[events]` table when empty), its
/// outbox in `store`.
pub(crate) fn app(store: &Arc<dyn Engine>, events: &str) -> carmy::App {
    app_with_env(store, events, &[])
}

pub(crate) fn app_with_env(
    store: &Arc<dyn Engine>,
    events: &str,
    env: &[(&str, &str)],
) -> carmy::App {
    let config = carmy::Config::parse(&format!("{}\n{events}", tokens()), |name| {
        env.iter()
            .find(|(var, _)| *var == name)
            .map(|(_, value)| (*value).to_owned())
    })
    .unwrap();
    tools::app(&Probe::default())
        .tool(crate::executions::detached::TOOL)
        .store(Arc::clone(store))
        .config(config)
}

/// A request as `token` (anonymous when `None`), with a JSON body when `body` is given.
pub(crate) use carmy_tests::send_as as call;

/// Creates a subscription as root; its JSON, with the secret.
pub(crate) async fn subscribe(router: &Router, url: &str, event_types: &[&str]) -> Value {
    let created = call(
        router,
        "POST",
        SUBSCRIPTIONS,
        Some(ROOT),
        Some(&json!({ "url": url, "event_types": event_types })),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json());
    created.json()
}

pub(crate) fn id(subscription: &Value) -> &str {
    subscription["id"].as_str().unwrap()
}

fn secret(subscription: &Value) -> SigningSecret {
    SigningSecret::parse(subscription["secret"].as_str().unwrap()).unwrap()
}

/// `echo` as `token`, with `request_id` when given; the answer.
pub(crate) async fn echo(router: &Router, token: Option<&str>, request_id: Option<&str>) -> Answer {
    let mut body = json!({ "tool": "echo", "arguments": { "text": "hi" } });
    if let Some(request_id) = request_id {
        body["request_id"] = json!(request_id);
    }
    execute_as(router, &body, token).await
}

/// `GET …/{id}` as root.
async fn read_subscription(router: &Router, subscription: &Value) -> Answer {
    let path = format!("{SUBSCRIPTIONS}/{}", id(subscription));
    call(router, "GET", &path, Some(ROOT), None).await
}

/// `GET …/{id}/deliveries` as root: the attempts, newest first.
async fn attempts(router: &Router, subscription: &str) -> Vec<Value> {
    let answer = call(
        router,
        "GET",
        &format!("{SUBSCRIPTIONS}/{subscription}/deliveries"),
        Some(ROOT),
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
    answer.json()["deliveries"].as_array().unwrap().clone()
}

/// Polls `check` until it holds, for at most [`DELIVERED_WITHIN`].
pub(crate) async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) {
    carmy_tests::wait::eventually(DELIVERED_WITHIN, what, check).await;
}

/// What a receiver answers a delivery.
#[derive(Debug, Clone)]
enum Reply {
    Status(u16, Vec<(&'static str, String)>),
    /// Never answers.
    Hang,
}

impl Reply {
    fn status(code: u16) -> Self {
        Reply::Status(code, Vec::new())
    }
}

/// One request a receiver got, with its Standard Webhooks headers.
#[derive(Debug, Clone)]
struct Delivery {
    id: String,
    timestamp: u64,
    signature: String,
    content_type: String,
    body: bytes::Bytes,
    at: Instant,
}

impl Delivery {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// Whether `secret` signed it, as a consumer verifies it.
    fn signed_by(&self, secret: &SigningSecret) -> bool {
        verify(
            secret,
            &self.id,
            self.timestamp,
            &self.body,
            &self.signature,
        )
    }
}

#[derive(Clone)]
struct ReceiverState {
    got: mpsc::UnboundedSender<Delivery>,
    replies: Arc<Mutex<VecDeque<Reply>>>,
    otherwise: Reply,
}

/// An HTTP receiver on a loopback port: records every request, answers the scripted replies in
/// turn, then `otherwise`.
struct Receiver {
    url: String,
    got: mpsc::UnboundedReceiver<Delivery>,
    _server: Server,
}

impl Receiver {
    async fn start(otherwise: Reply, replies: Vec<Reply>) -> Self {
        let (sender, got) = mpsc::unbounded_channel();
        let state = ReceiverState {
            got: sender,
            replies: Arc::new(Mutex::new(replies.into())),
            otherwise,
        };
        let router = Router::new().fallback(receive).with_state(state);
        let server = Server::start(router).await;
        Receiver {
            url: format!("http://{}/hooks", server.addr),
            got,
            _server: server,
        }
    }

    /// A receiver answering `204` to everything.
    async fn ok() -> Self {
        Self::start(Reply::status(204), Vec::new()).await
    }

    /// The next delivery, within [`DELIVERED_WITHIN`].
    async fn next(&mut self) -> Delivery {
        tokio::time::timeout(DELIVERED_WITHIN, self.got.recv())
            .await
            .unwrap_or_else(|_| panic!("no delivery within {DELIVERED_WITHIN:?}"))
            .unwrap()
    }

    /// Nothing arrives for `quiet`.
    async fn nothing_for(&mut self, quiet: Duration) {
        if let Ok(Some(delivery)) = tokio::time::timeout(quiet, self.got.recv()).await {
            panic!("unexpected delivery: {delivery:?} {}", delivery.json());
        }
    }
}

async fn receive(
    State(state): State<ReceiverState>,
    headers: HeaderMap,
    body: bytes::Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let _ = state.got.send(Delivery {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp").parse().unwrap_or(0),
        signature: header("webhook-signature"),
        content_type: header("content-type"),
        body,
        at: Instant::now(),
    });
    let reply = state
        .replies
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| state.otherwise.clone());
    match reply {
        Reply::Status(code, headers) => {
            let mut response = StatusCode::from_u16(code).unwrap().into_response();
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            response
        }
        Reply::Hang => std::future::pending().await,
    }
}

/// A loopback URL where nothing listens: a port bound, then released.
pub(crate) async fn down_url() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}/hooks")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A delivery's headers and body are those of a Standard Webhooks message of type `kind`,
/// signed by `secret` for this attempt.
fn assert_signed_event(delivery: &Delivery, kind: &str, secret: &SigningSecret) -> Value {
    assert!(delivery.id.starts_with("evt_"), "{delivery:?}");
    assert!(
        delivery.timestamp.abs_diff(unix_now()) < 60,
        "the timestamp is this attempt's: {delivery:?}"
    );
    assert!(delivery.signature.starts_with("v1,"), "{delivery:?}");
    assert!(delivery.signed_by(secret), "{delivery:?}");
    assert_eq!(delivery.content_type, "application/json");
    let body = delivery.json();
    assert_eq!(body["type"], kind, "{body}");
    let timestamp = body["timestamp"].as_str().unwrap();
    assert!(humantime::parse_rfc3339(timestamp).is_ok(), "{body}");
    let mut keys: Vec<&String> = body.as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["data", "timestamp", "type"], "{body}");
    body["data"].clone()
}

#[tokio::test]
async fn a_subscription_is_created_read_listed_and_deleted_and_creating_it_sends_nothing() {
    let Some(store) = store("crud").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let mut receiver = Receiver::ok().await;

    let created = call(
        &router,
        "POST",
        SUBSCRIPTIONS,
        Some(ROOT),
        Some(&json!({
            "url": receiver.url,
            "event_types": ["execution.finished", "health.changed"],
            "description": "the test's receiver",
        })),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json());
    assert_eq!(created.header("content-type"), Some("application/json"));
    let body = created.json();
    let id = id(&body).to_owned();
    assert!(id.starts_with("sub_"), "{body}");
    assert_eq!(
        created.header("location"),
        Some(format!("{SUBSCRIPTIONS}/{id}").as_str())
    );
    assert_eq!(body["url"], json!(receiver.url));
    assert_eq!(
        body["event_types"],
        json!(["execution.finished", "health.changed"])
    );
    assert_eq!(body["description"], "the test's receiver");
    assert_eq!(body["status"], "enabled");
    let whsec = body["secret"].as_str().unwrap();
    assert!(whsec.starts_with("whsec_"), "{body}");
    SigningSecret::parse(whsec).unwrap();
    humantime::parse_rfc3339(body["created_at"].as_str().unwrap()).unwrap();

    // No verification ping, or anything else.
    receiver.nothing_for(Duration::from_secs(1)).await;

    let read = call(
        &router,
        "GET",
        &format!("{SUBSCRIPTIONS}/{id}"),
        Some(ROOT),
        None,
    )
    .await;
    assert_eq!(read.status, StatusCode::OK);
    let mut without_secret = body.clone();
    without_secret.as_object_mut().unwrap().remove("secret");
    assert_eq!(read.json(), without_secret);

    let second = subscribe(&router, &receiver.url, &["tools.changed"]).await;
    let listed = call(&router, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    assert_eq!(listed.status, StatusCode::OK);
    assert!(
        !String::from_utf8_lossy(&listed.body).contains("whsec_"),
        "a list never shows a secret: {}",
        listed.json()
    );
    let ids: Vec<Value> = listed.json()["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|listed| listed["id"].clone())
        .collect();
    assert_eq!(ids, [body["id"].clone(), second["id"].clone()]);
    assert_eq!(listed.json()["subscriptions"][0], without_secret);

    let path = format!("{SUBSCRIPTIONS}/{id}");
    let deleted = call(&router, "DELETE", &path, Some(ROOT), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    assert!(deleted.body.is_empty());
    for (method, path) in [
        ("GET", path.clone()),
        ("DELETE", path.clone()),
        ("GET", format!("{path}/deliveries")),
        ("POST", format!("{path}/rotate-secret")),
    ] {
        let gone = call(&router, method, &path, Some(ROOT), None).await;
        assert_eq!(gone.status, StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(
            gone.json()["error"]["code"],
            "SUBSCRIPTION_NOT_FOUND",
            "{method} {path}"
        );
    }
    let patched = call(
        &router,
        "PATCH",
        &path,
        Some(ROOT),
        Some(&json!({"enabled": true})),
    )
    .await;
    assert_eq!(patched.json()["error"]["code"], "SUBSCRIPTION_NOT_FOUND");
    let listed = call(&router, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    assert_eq!(listed.json()["subscriptions"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn malformed_subscription_requests_are_json_400s() {
    let Some(store) = store("malformed").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let receiver = Receiver::ok().await;
    let url = receiver.url.as_str();
    for (what, body) in [
        (
            "an unknown field",
            json!({ "url": url, "event_types": ["tools.changed"], "colour": "red" }),
        ),
        ("no url", json!({ "event_types": ["tools.changed"] })),
        ("no event types", json!({ "url": url })),
        (
            "empty event types",
            json!({ "url": url, "event_types": [] }),
        ),
        (
            "an unknown event type",
            json!({ "url": url, "event_types": ["tools.changed", "order.placed"] }),
        ),
        (
            "a url that is not a string",
            json!({ "url": 5, "event_types": ["tools.changed"] }),
        ),
        ("an array", json!([url])),
    ] {
        let refused = call(&router, "POST", SUBSCRIPTIONS, Some(ROOT), Some(&body)).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{what}");
        assert_eq!(refused.header("content-type"), Some("application/json"));
        assert_eq!(refused.json()["error"]["category"], "validation", "{what}");
    }

    let not_json = send(
        &router,
        Request::post(SUBSCRIPTIONS)
            .header("authorization", bearer(ROOT))
            .header("content-type", "application/json")
            .body(Body::from("{\"url\": "))
            .unwrap(),
    )
    .await;
    assert_eq!(not_json.status, StatusCode::BAD_REQUEST);
    assert_eq!(not_json.json()["error"]["category"], "validation");

    let subscription = subscribe(&router, url, &["tools.changed"]).await;
    let path = format!("{SUBSCRIPTIONS}/{}", id(&subscription));
    let patched = call(
        &router,
        "PATCH",
        &path,
        Some(ROOT),
        Some(&json!({ "event_types": ["nothing.happened"] })),
    )
    .await;
    assert_eq!(patched.status, StatusCode::BAD_REQUEST);
    let patched = call(
        &router,
        "PATCH",
        &path,
        Some(ROOT),
        Some(&json!({ "url": url })),
    )
    .await;
    assert_eq!(
        patched.status,
        StatusCode::BAD_REQUEST,
        "the URL cannot change"
    );

    let rotate = call(
        &router,
        "POST",
        &format!("{path}/rotate-secret"),
        Some(ROOT),
        Some(&json!({})),
    )
    .await;
    assert_eq!(rotate.status, StatusCode::BAD_REQUEST);
    assert_eq!(rotate.json()["error"]["category"], "validation");
    // The refused rotation rotated nothing: the next one answers a new secret once.
    let rotated = call(
        &router,
        "POST",
        &format!("{path}/rotate-secret"),
        Some(ROOT),
        None,
    )
    .await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.json());
    assert_ne!(rotated.json()["secret"], subscription["secret"]);
}

/// Every route and method of the subscriptions API, for the subscription `id`.
fn routes(id: &str) -> Vec<(&'static str, String, Option<Value>)> {
    let one = format!("{SUBSCRIPTIONS}/{id}");
    vec![
        ("GET", SUBSCRIPTIONS.to_owned(), None),
        (
            "POST",
            SUBSCRIPTIONS.to_owned(),
            Some(json!({ "url": "https://example.com/", "event_types": ["tools.changed"] })),
        ),
        ("GET", one.clone(), None),
        ("PATCH", one.clone(), Some(json!({ "enabled": true }))),
        ("POST", format!("{one}/rotate-secret"), None),
        ("GET", format!("{one}/deliveries"), None),
        ("DELETE", one, None),
    ]
}

#[tokio::test]
async fn callers_without_manage_events_see_the_unknown_route_everywhere() {
    let Some(store) = store("access").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let receiver = Receiver::ok().await;
    let subscription = subscribe(&router, &receiver.url, &["tools.changed"]).await;
    let unknown = call(&router, "GET", "/agent/nothing-here", None, None).await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
    assert_eq!(unknown.json()["error"]["code"], "ROUTE_NOT_FOUND");

    for token in [None, Some(PLAIN), Some("not-a-token-at-all")] {
        for (method, path, body) in routes(id(&subscription)) {
            let hidden = call(&router, method, &path, token, body.as_ref()).await;
            if token == Some("not-a-token-at-all") {
                // A bad token is refused before any route.
                assert_eq!(hidden.status, StatusCode::UNAUTHORIZED, "{method} {path}");
                continue;
            }
            assert_eq!(
                hidden.status,
                StatusCode::NOT_FOUND,
                "{token:?} {method} {path}"
            );
            assert_eq!(hidden.body, unknown.body, "{token:?} {method} {path}");
            assert_eq!(hidden.header("content-type"), Some("application/json"));
        }
    }
    // The hidden calls changed nothing.
    let listed = call(&router, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    assert_eq!(listed.json()["subscriptions"].as_array().unwrap().len(), 1);
    let read = read_subscription(&router, &subscription).await;
    assert_eq!(read.json()["status"], "enabled");
}

#[tokio::test]
async fn a_known_token_with_manage_events_manages_subscriptions() {
    let Some(store) = store("manager").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let receiver = Receiver::ok().await;
    let created = call(
        &router,
        "POST",
        SUBSCRIPTIONS,
        Some(MANAGER),
        Some(&json!({ "url": receiver.url, "event_types": ["tools.changed"] })),
    )
    .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json());
    let one = format!("{SUBSCRIPTIONS}/{}", id(&created.json()));
    for (method, path, status) in [
        ("GET", SUBSCRIPTIONS.to_owned(), StatusCode::OK),
        ("GET", one.clone(), StatusCode::OK),
        ("POST", format!("{one}/rotate-secret"), StatusCode::OK),
        ("GET", format!("{one}/deliveries"), StatusCode::OK),
        ("DELETE", one.clone(), StatusCode::NO_CONTENT),
    ] {
        let answer = call(&router, method, &path, Some(MANAGER), None).await;
        assert_eq!(answer.status, status, "{method} {path}");
    }
    // Root sees what the manager did: one made through the API is everyone's.
    let listed = call(&router, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    assert_eq!(listed.json()["subscriptions"], json!([]));
}

#[tokio::test]
async fn without_an_events_table_there_are_no_event_routes_and_no_capability() {
    let Some(store) = store("off").await else {
        return;
    };
    let off = app(&store, "").router().unwrap();
    let unknown = call(&off, "GET", "/agent/nothing-here", None, None).await;
    for (method, path, body) in routes("sub_0123") {
        for token in [Some(ROOT), Some(MANAGER)] {
            let answer = call(&off, method, &path, token, body.as_ref()).await;
            assert_eq!(answer.status, StatusCode::NOT_FOUND, "{method} {path}");
            assert_eq!(answer.body, unknown.body, "{method} {path}");
        }
    }
    let capabilities = |router: Router| async move {
        call(&router, "GET", "/.well-known/agent", None, None)
            .await
            .json()["capabilities"]
            .as_array()
            .unwrap()
            .clone()
    };
    assert!(!capabilities(off).await.contains(&json!("events")));
    let on = app(&store, &events_table(SHORT, "")).router().unwrap();
    assert!(capabilities(on).await.contains(&json!("events")));
}

#[tokio::test]
async fn execution_finished_is_signed_and_delivered_for_kept_executions_only() {
    let Some(store) = store("finished").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let mut receiver = Receiver::ok().await;
    let subscription = subscribe(&router, &receiver.url, &["execution.finished"]).await;
    let secret = secret(&subscription);

    // Sync, identified, without a request_id: no record, no event.
    let plain = echo(&router, Some(PLAIN), None).await;
    assert_eq!(plain.status, StatusCode::OK, "{}", plain.json());
    let identified = echo(&router, Some(PLAIN), Some("req-identified")).await;
    assert_eq!(identified.status, StatusCode::OK);
    let anonymous = echo(&router, None, Some("req-anonymous")).await;
    assert_eq!(anonymous.status, StatusCode::OK, "{}", anonymous.json());
    let started = send(
        &router,
        execute_request(
            &json!({ "tool": "detached", "arguments": { "reports": 0, "millis": 10 } }),
            &[("authorization", &bearer(MANAGER))],
        ),
    )
    .await;
    assert_eq!(started.status, StatusCode::ACCEPTED, "{}", started.json());

    let mut expected: Vec<Value> = vec![
        json!({
            "execution_id": identified.json()["execution_id"],
            "tool": "echo",
            "status": "completed",
            "caller": "plain",
        }),
        json!({
            "execution_id": anonymous.json()["execution_id"],
            "tool": "echo",
            "status": "completed",
            "caller": "anonymous",
        }),
        json!({
            "execution_id": started.json()["execution_id"],
            "tool": "detached",
            "status": "completed",
            "caller": "manager",
        }),
    ];
    let mut event_ids = HashSet::new();
    while !expected.is_empty() {
        let delivery = receiver.next().await;
        let data = assert_signed_event(&delivery, "execution.finished", &secret);
        let position = expected
            .iter()
            .position(|wanted| *wanted == data)
            .unwrap_or_else(|| panic!("unexpected event {data}, expected one of {expected:?}"));
        expected.remove(position);
        assert!(event_ids.insert(delivery.id.clone()), "one id per event");
    }
    assert!(
        !plain.json()["execution_id"].is_null(),
        "the plain call had an id too, and no event"
    );
    receiver.nothing_for(Duration::from_secs(2)).await;
    let logged = attempts(&router, id(&subscription)).await;
    assert_eq!(logged.len(), 3, "{logged:?}");
    for attempt in &logged {
        assert_eq!(attempt["status_code"], 204, "{attempt}");
        assert!(attempt["error"].is_null(), "{attempt}");
        assert!(event_ids.contains(attempt["event_id"].as_str().unwrap()));
    }
}

#[tokio::test]
async fn the_event_is_in_the_outbox_before_the_call_is_answered() {
    if let Some(store) = store("outbox_first").await {
        outbox_first(store).await;
    }
}

#[tokio::test]
async fn the_event_is_in_the_postgres_outbox_before_the_call_is_answered() {
    if let Some(store) = postgres("outbox_first").await {
        outbox_first(store).await;
    }
}

async fn outbox_first(store: Arc<dyn Engine>) {
    // Down, and retried only in an hour: the event stays in the outbox.
    let router = app(&store, &events_table(&["1h"], "")).router().unwrap();
    let subscription = subscribe(&router, &down_url().await, &["execution.finished"]).await;
    assert_eq!(store.pending_deliveries().await.unwrap(), 0);
    for n in 1..=3 {
        let answer = echo(&router, Some(PLAIN), Some(&format!("req-{n}"))).await;
        assert_eq!(answer.status, StatusCode::OK);
        // Read as soon as the answer is in: nothing after it could have written it.
        assert_eq!(store.pending_deliveries().await.unwrap(), n);
    }
    // The attempts that follow are logged: no status, an error, still pending.
    eventually("three failed attempts", async || {
        attempts(&router, id(&subscription)).await.len() == 3
    })
    .await;
    for attempt in attempts(&router, id(&subscription)).await {
        assert!(attempt["status_code"].is_null(), "{attempt}");
        assert!(
            attempt["error"]
                .as_str()
                .is_some_and(|error| !error.is_empty()),
            "{attempt}"
        );
        humantime::parse_rfc3339(attempt["at"].as_str().unwrap()).unwrap();
        assert!(attempt["duration_ms"].is_u64(), "{attempt}");
    }
    assert_eq!(store.pending_deliveries().await.unwrap(), 3);
}

#[tokio::test]
async fn retries_keep_the_webhook_id_and_sign_each_attempt_afresh() {
    // On PostgreSQL: the retry's due time is the database's.
    let Some(store) = postgres("retries").await else {
        return;
    };
    // Retries at least 1.35 s apart (with the jitter): each attempt has its own second.
    let router = app(&store, &events_table(&["1500ms", "1500ms"], ""))
        .router()
        .unwrap();
    let mut receiver = Receiver::start(
        Reply::status(204),
        vec![Reply::status(500), Reply::status(502)],
    )
    .await;
    let subscription = subscribe(&router, &receiver.url, &["execution.finished"]).await;
    let secret = secret(&subscription);
    echo(&router, Some(PLAIN), Some("req-retried")).await;

    let first = receiver.next().await;
    let second = receiver.next().await;
    let third = receiver.next().await;
    for delivery in [&first, &second, &third] {
        assert_signed_event(delivery, "execution.finished", &secret);
        assert_eq!(delivery.id, first.id, "the same webhook-id on every retry");
        assert_eq!(delivery.body, first.body, "the same message on every retry");
    }
    assert!(first.timestamp < second.timestamp && second.timestamp < third.timestamp);
    // Each signature is its attempt's: the first one does not sign the second's timestamp.
    assert_ne!(first.signature, second.signature);
    assert!(!verify(
        &secret,
        &second.id,
        second.timestamp,
        &second.body,
        &first.signature
    ));
    // Delivered on the third: no more attempts.
    receiver.nothing_for(Duration::from_secs(3)).await;
    let logged = attempts(&router, id(&subscription)).await;
    let codes: Vec<&Value> = logged
        .iter()
        .map(|attempt| &attempt["status_code"])
        .collect();
    assert_eq!(
        codes,
        [&json!(204), &json!(502), &json!(500)],
        "newest first"
    );
    assert_eq!(store.pending_deliveries().await.unwrap(), 0);
}

#[tokio::test]
async fn retry_after_on_429_and_503_delays_the_retry() {
    let Some(store) = store("retry_after").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let retry_after =
        |code: u16, seconds: &str| Reply::Status(code, vec![("retry-after", seconds.to_owned())]);
    let mut receiver = Receiver::start(
        Reply::status(204),
        vec![retry_after(429, "1"), retry_after(503, "2")],
    )
    .await;
    subscribe(&router, &receiver.url, &["execution.finished"]).await;
    echo(&router, Some(PLAIN), Some("req-later")).await;

    let first = receiver.next().await;
    let second = receiver.next().await;
    let third = receiver.next().await;
    assert_eq!(first.id, third.id);
    // The schedule alone would retry after 0.2 s and 0.4 s.
    assert!(
        second.at - first.at >= Duration::from_secs(1),
        "{:?}",
        second.at - first.at
    );
    assert!(
        third.at - second.at >= Duration::from_secs(2),
        "{:?}",
        third.at - second.at
    );
    receiver.nothing_for(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_redirect_is_a_failure_and_is_not_followed() {
    let Some(store) = store("redirect").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let mut elsewhere = Receiver::ok().await;
    let mut receiver = Receiver::start(
        Reply::Status(307, vec![("location", elsewhere.url.clone())]),
        Vec::new(),
    )
    .await;
    let subscription = subscribe(&router, &receiver.url, &["execution.finished"]).await;
    echo(&router, Some(PLAIN), Some("req-redirected")).await;
    for _ in 0..3 {
        receiver.next().await;
    }
    receiver.nothing_for(Duration::from_secs(2)).await;
    elsewhere.nothing_for(Duration::ZERO).await;
    let logged = attempts(&router, id(&subscription)).await;
    assert_eq!(logged.len(), 3, "{logged:?}");
    for attempt in logged {
        assert_eq!(attempt["status_code"], 307, "{attempt}");
        assert!(
            attempt["error"].as_str().unwrap().contains("redirect"),
            "{attempt}"
        );
    }
    assert_eq!(store.pending_deliveries().await.unwrap(), 0);
}

#[tokio::test]
async fn a_delivery_failing_every_attempt_fails_for_good_once_the_schedule_is_spent() {
    let Some(store) = store("spent").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let mut receiver = Receiver::start(Reply::status(500), Vec::new()).await;
    let subscription = subscribe(&router, &receiver.url, &["execution.finished"]).await;
    echo(&router, Some(PLAIN), Some("req-failing")).await;
    let first = receiver.next().await;
    // The first attempt and one per delay of the schedule.
    for _ in 0..2 {
        assert_eq!(receiver.next().await.id, first.id);
    }
    receiver.nothing_for(Duration::from_secs(2)).await;
    eventually("the failure recorded", async || {
        store.pending_deliveries().await.unwrap() == 0
    })
    .await;
    let logged = attempts(&router, id(&subscription)).await;
    assert_eq!(logged.len(), 3, "{logged:?}");
    let mut previous: Option<SystemTime> = None;
    for attempt in &logged {
        assert_eq!(attempt["event_id"], json!(first.id));
        assert_eq!(attempt["status_code"], 500, "{attempt}");
        assert!(
            attempt["error"].as_str().unwrap().contains("500"),
            "{attempt}"
        );
        assert!(
            attempt["duration_ms"].as_u64().unwrap() < 15_000,
            "{attempt}"
        );
        let at = humantime::parse_rfc3339(attempt["at"].as_str().unwrap()).unwrap();
        if let Some(previous) = previous {
            assert!(at < previous, "newest first: {logged:?}");
        }
        previous = Some(at);
    }
    // Failing for good does not disable the subscription (that takes `disable_after`).
    let read = read_subscription(&router, &subscription).await;
    assert_eq!(read.json()["status"], "enabled");
}

#[tokio::test]
async fn gone_disables_the_subscription_and_tells_the_subscribers_of_subscription_disabled() {
    let Some(store) = store("gone").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let mut leaving = Receiver::start(Reply::status(204), vec![Reply::status(410)]).await;
    let mut watcher = Receiver::ok().await;
    let gone = subscribe(&router, &leaving.url, &["execution.finished"]).await;
    let watching = subscribe(&router, &watcher.url, &["subscription.disabled"]).await;
    echo(&router, Some(PLAIN), Some("req-gone")).await;
    leaving.next().await;

    let told = watcher.next().await;
    let data = assert_signed_event(&told, "subscription.disabled", &secret(&watching));
    assert_eq!(data["id"], gone["id"], "{data}");
    let path = format!("{SUBSCRIPTIONS}/{}", id(&gone));
    let read = call(&router, "GET", &path, Some(ROOT), None).await;
    assert_eq!(read.json()["status"], "disabled", "{}", read.json());
    assert!(
        read.json()["disabled_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("410")),
        "{}",
        read.json()
    );
    // No retry after a 410, and no delivery while disabled.
    echo(&router, Some(PLAIN), Some("req-while-disabled")).await;
    leaving.nothing_for(Duration::from_secs(2)).await;
    watcher.nothing_for(Duration::ZERO).await;

    let enabled = call(
        &router,
        "PATCH",
        &path,
        Some(ROOT),
        Some(&json!({ "enabled": true })),
    )
    .await;
    assert_eq!(enabled.status, StatusCode::OK, "{}", enabled.json());
    assert_eq!(enabled.json()["status"], "enabled");
    assert!(enabled.json().get("disabled_reason").is_none());
    let answer = echo(&router, Some(PLAIN), Some("req-back")).await;
    let back = leaving.next().await;
    assert_eq!(
        assert_signed_event(&back, "execution.finished", &secret(&gone))["execution_id"],
        answer.json()["execution_id"]
    );
}

/// A subscription whose deliveries fail without a success for `disable_after` is disabled,
/// and the subscribers of `subscription.disabled` are told.
#[tokio::test]
async fn a_subscription_failing_for_disable_after_is_disabled() {
    let Some(store) = store("failing").await else {
        return;
    };
    let schedule = ["200ms"; 20];
    let router = app(&store, &events_table(&schedule, "disable_after = \"1s\"\n"))
        .router()
        .unwrap();
    let mut failing = Receiver::start(Reply::status(500), Vec::new()).await;
    let mut watcher = Receiver::ok().await;
    let doomed = subscribe(&router, &failing.url, &["execution.finished"]).await;
    let watching = subscribe(&router, &watcher.url, &["subscription.disabled"]).await;
    // The failure clock starts when the first attempt is made, after this and before the
    // receiver sees it.
    let before_the_first_attempt = Instant::now();
    echo(&router, Some(PLAIN), Some("req-failing")).await;
    failing.next().await;

    let told = watcher.next().await;
    let data = assert_signed_event(&told, "subscription.disabled", &secret(&watching));
    assert_eq!(data["id"], doomed["id"], "{data}");
    assert!(
        told.at.duration_since(before_the_first_attempt) >= Duration::from_secs(1),
        "disabled only after failing for disable_after"
    );
    let read = read_subscription(&router, &doomed).await;
    assert_eq!(read.json()["status"], "disabled", "{}", read.json());
    assert!(
        read.json()["disabled_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("without a success")),
        "{}",
        read.json()
    );
    // Disabled: its remaining retries are not attempted.
    while let Ok(Some(_)) =
        tokio::time::timeout(Duration::from_millis(300), failing.got.recv()).await
    {}
    failing.nothing_for(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_rotated_secret_signs_alongside_the_old_one() {
    let Some(store) = store("rotation").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let mut receiver = Receiver::ok().await;
    let subscription = subscribe(&router, &receiver.url, &["execution.finished"]).await;
    let old = secret(&subscription);
    let path = format!("{SUBSCRIPTIONS}/{}/rotate-secret", id(&subscription));
    let rotated = call(&router, "POST", &path, Some(ROOT), None).await;
    assert_eq!(rotated.status, StatusCode::OK, "{}", rotated.json());
    assert_eq!(rotated.json()["id"], subscription["id"]);
    let new = secret(&rotated.json());
    assert_ne!(new.to_whsec(), old.to_whsec());
    let read = read_subscription(&router, &subscription).await;
    assert!(
        read.json().get("secret").is_none(),
        "shown once: {}",
        read.json()
    );

    echo(&router, Some(PLAIN), Some("req-rotated")).await;
    let delivery = receiver.next().await;
    let signatures: Vec<&str> = delivery.signature.split(' ').collect();
    assert_eq!(signatures.len(), 2, "{delivery:?}");
    let by = |secret: &SigningSecret, signature: &str| {
        assert!(signature.starts_with("v1,"), "{signature}");
        verify(
            secret,
            &delivery.id,
            delivery.timestamp,
            &delivery.body,
            signature,
        )
    };
    let old_signs: Vec<bool> = signatures.iter().map(|one| by(&old, one)).collect();
    let new_signs: Vec<bool> = signatures.iter().map(|one| by(&new, one)).collect();
    assert_eq!(old_signs.iter().filter(|signs| **signs).count(), 1);
    assert_eq!(new_signs.iter().filter(|signs| **signs).count(), 1);
    assert_ne!(old_signs, new_signs, "one signature per secret");
}

#[tokio::test]
async fn refused_urls_are_refused_at_creation() {
    let Some(store) = store("ssrf").await else {
        return;
    };
    // No connection is attempted: nothing listens at these, and the refusal comes first.
    let refused = async |router: &Router, url: &str| {
        let answer = call(
            router,
            "POST",
            SUBSCRIPTIONS,
            Some(ROOT),
            Some(&json!({ "url": url, "event_types": ["tools.changed"] })),
        )
        .await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{url}: {}",
            answer.json()
        );
        let error = &answer.json()["error"];
        assert_eq!(error["code"], "WEBHOOK_URL_REFUSED", "{url}");
        assert!(
            error["details"]["reason"]
                .as_str()
                .is_some_and(|reason| !reason.is_empty()),
            "{url}: {error}"
        );
        error["details"]["reason"].as_str().unwrap().to_owned()
    };

    let https_only = app(&store, "[events]\n").router().unwrap();
    let reason = refused(&https_only, "http://127.0.0.1:9/hooks").await;
    assert!(reason.contains("http"), "{reason}");
    refused(&https_only, "https://127.0.0.1:9/hooks").await;
    refused(&https_only, "ftp://example.com/hooks").await;
    refused(&https_only, "not a url").await;

    let plain_http = app(&store, "[events]\nallow_http = true\n")
        .router()
        .unwrap();
    for url in [
        "http://127.0.0.1:9/hooks",
        "http://[::1]:9/hooks",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:127.0.0.1]/",
        "http://[::ffff:a9fe:a9fe]/",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://0.0.0.0/",
        "http://[fd00:ec2::254]/",
    ] {
        let reason = refused(&plain_http, url).await;
        assert!(
            !reason.contains("http://"),
            "the reason is not the URL: {reason}"
        );
    }

    // Allowing loopback allows loopback only.
    let loopback = app(&store, &events_table(SHORT, "")).router().unwrap();
    for url in [
        "http://169.254.169.254/",
        "http://10.0.0.1/",
        "http://[fd00:ec2::254]/",
    ] {
        refused(&loopback, url).await;
    }
    let listed = call(&loopback, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    assert_eq!(listed.json()["subscriptions"], json!([]));
}

/// A secret the tests give declared subscriptions through their environment.
pub(crate) fn declared_secret() -> SigningSecret {
    SigningSecret::from_bytes(&[7; 32]).unwrap()
}

#[tokio::test]
async fn declared_subscriptions_are_listed_delivered_and_read_only() {
    let Some(store) = store("declared").await else {
        return;
    };
    let mut receiver = Receiver::ok().await;
    let whsec = declared_secret().to_whsec();
    let declared = format!(
        "[[events.subscriptions]]\nurl = \"{}\"\nevent_types = [\"execution.finished\"]\nsecret_env = \"HOOKS_SECRET\"\n",
        receiver.url
    );
    let router = app_with_env(
        &store,
        &events_table(SHORT, &declared),
        &[("HOOKS_SECRET", &whsec)],
    )
    .router()
    .unwrap();

    let listed = call(&router, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    let listed = listed.json()["subscriptions"].as_array().unwrap().clone();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let subscription = &listed[0];
    assert_eq!(subscription["source"], "config");
    assert_eq!(subscription["url"], json!(receiver.url));
    assert_eq!(subscription["event_types"], json!(["execution.finished"]));
    assert!(subscription.get("secret").is_none());
    let id = id(subscription);
    assert!(id.starts_with("sub_"), "{id}");
    let path = format!("{SUBSCRIPTIONS}/{id}");
    let read = call(&router, "GET", &path, Some(ROOT), None).await;
    assert_eq!(read.json(), *subscription);

    let answer = echo(&router, Some(PLAIN), Some("req-declared")).await;
    let delivery = receiver.next().await;
    let data = assert_signed_event(&delivery, "execution.finished", &declared_secret());
    assert_eq!(data["execution_id"], answer.json()["execution_id"]);
    // Logged once the receiver's answer is in.
    eventually("the attempt logged", async || {
        !attempts(&router, id).await.is_empty()
    })
    .await;
    let logged = attempts(&router, id).await;
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["event_id"], json!(delivery.id));

    for (method, path, body) in [
        ("DELETE", path.clone(), None),
        ("PATCH", path.clone(), Some(json!({ "enabled": false }))),
        ("POST", format!("{path}/rotate-secret"), None),
    ] {
        let refused = call(&router, method, &path, Some(ROOT), body.as_ref()).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{method} {path}");
        assert_eq!(refused.json()["error"]["code"], "SUBSCRIPTION_DECLARED");
    }
    let still = call(&router, "GET", &path, Some(ROOT), None).await;
    assert_eq!(still.json(), *subscription);
}

#[test]
fn a_declared_subscription_without_its_variable_is_a_config_error_naming_it() {
    let declared = "[events]\n[[events.subscriptions]]\nurl = \"https://hooks.example.com/\"\n\
                    event_types = [\"tools.changed\"]\nsecret_env = \"MISSING_HOOKS_SECRET\"\n";
    let error = carmy::Config::parse(declared, |_| None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("MISSING_HOOKS_SECRET"), "{error}");
    let error = carmy::Config::parse(declared, |name| {
        (name == "MISSING_HOOKS_SECRET").then(|| "not-a-secret".to_owned())
    })
    .unwrap_err()
    .to_string();
    assert!(error.contains("MISSING_HOOKS_SECRET"), "{error}");
    assert!(
        !error.contains("not-a-secret"),
        "the value is a secret: {error}"
    );
}

#[tokio::test]
async fn health_changes_are_delivered_to_their_subscribers() {
    let Some(store) = store("health").await else {
        return;
    };
    let app = app(&store, &events_table(SHORT, ""));
    let health = app.health();
    let router = app.router().unwrap();
    let mut receiver = Receiver::ok().await;
    let mut others = Receiver::ok().await;
    let subscription = subscribe(&router, &receiver.url, &["health.changed"]).await;
    subscribe(
        &router,
        &others.url,
        &["tools.changed", "execution.finished"],
    )
    .await;

    health.report_degrading("payments slow").unwrap();
    let delivery = receiver.next().await;
    let data = assert_signed_event(&delivery, "health.changed", &secret(&subscription));
    assert_eq!(data["from"], "healthy", "{data}");
    assert_eq!(data["to"], "degrading", "{data}");
    assert_eq!(data["reason"], "payments slow", "{data}");
    health.report_healthy().unwrap();
    let data = receiver.next().await.json()["data"].clone();
    assert_eq!(
        (&data["from"], &data["to"]),
        (&json!("degrading"), &json!("healthy"))
    );
    others.nothing_for(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_reload_that_hides_a_tool_delivers_tools_changed() {
    let Some(store) = store("tools").await else {
        return;
    };
    let dir = TempDir::new("webhooks-tools");
    let path = dir.0.join("carmy.toml");
    let text = format!("{}\n{}", tokens(), events_table(SHORT, ""));
    std::fs::write(&path, &text).unwrap();
    let router = tools::app(&Probe::default())
        .store(Arc::clone(&store))
        .config_file(&path)
        .unwrap()
        .router()
        .unwrap();
    let mut receiver = Receiver::ok().await;
    let subscription = subscribe(&router, &receiver.url, &["tools.changed"]).await;

    let staged = dir.0.join(".carmy.toml.swp");
    std::fs::write(&staged, format!("{text}\n[tools.echo]\nenabled = false\n")).unwrap();
    std::fs::rename(&staged, &path).unwrap();
    let reloaded = call(&router, "POST", "/agent/admin/reload", Some(ROOT), None).await;
    assert_eq!(reloaded.status, StatusCode::OK, "{}", reloaded.json());
    assert_eq!(
        echo(&router, Some(PLAIN), None).await.json()["error"]["code"],
        "TOOL_NOT_FOUND"
    );

    let delivery = receiver.next().await;
    let data = assert_signed_event(&delivery, "tools.changed", &secret(&subscription));
    let discovery = call(&router, "GET", "/.well-known/agent", Some(ROOT), None).await;
    assert_eq!(
        data["tools_version"],
        discovery.json()["tools_version"],
        "{data}"
    );
    assert_eq!(
        data["tools_versions"]["internal"], data["tools_version"],
        "{data}"
    );
    // One reload, one event (the watcher may have seen the file first; never twice).
    receiver.nothing_for(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_slow_receiver_delays_neither_answers_nor_other_subscribers() {
    let Some(store) = store("slow").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "attempt_timeout = \"60s\"\n"))
        .router()
        .unwrap();
    let mut slow = Receiver::start(Reply::Hang, Vec::new()).await;
    let mut fast = Receiver::ok().await;
    subscribe(&router, &slow.url, &["execution.finished"]).await;
    subscribe(&router, &fast.url, &["execution.finished"]).await;

    let began = Instant::now();
    for n in 0..5 {
        let answer = echo(&router, Some(PLAIN), Some(&format!("req-slow-{n}"))).await;
        assert_eq!(answer.status, StatusCode::OK);
        let delivery = fast.next().await;
        assert_eq!(
            delivery.json()["data"]["execution_id"],
            answer.json()["execution_id"]
        );
        slow.next().await;
    }
    // Five attempts hang on the slow receiver, none answered, and well within one attempt's
    // timeout every answer and every other delivery came.
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
}

/// A method the routes do not take is the unknown route too, unless the caller may manage
/// subscriptions: a `405` would tell anyone the routes exist (and that events are on).
#[tokio::test]
async fn a_wrong_method_reveals_the_routes_only_to_managers() {
    let Some(store) = store("methods").await else {
        return;
    };
    let on = app(&store, &events_table(SHORT, "")).router().unwrap();
    let off = app(&store, "").router().unwrap();
    let unknown = call(&on, "GET", "/agent/nothing-here", None, None).await;
    let wrong = [
        ("PUT", SUBSCRIPTIONS.to_owned()),
        ("DELETE", SUBSCRIPTIONS.to_owned()),
        ("POST", format!("{SUBSCRIPTIONS}/sub_0123")),
        ("GET", format!("{SUBSCRIPTIONS}/sub_0123/rotate-secret")),
        ("DELETE", format!("{SUBSCRIPTIONS}/sub_0123/deliveries")),
    ];
    for (method, path) in &wrong {
        for (router, token) in [
            (&on, None),
            (&on, Some(PLAIN)),
            (&off, None),
            (&off, Some(ROOT)),
            (&off, Some(MANAGER)),
        ] {
            let hidden = call(router, method, path, token, None).await;
            assert_eq!(
                hidden.status,
                StatusCode::NOT_FOUND,
                "{token:?} {method} {path}"
            );
            assert_eq!(hidden.body, unknown.body, "{token:?} {method} {path}");
        }
        for token in [ROOT, MANAGER] {
            let refused = call(&on, method, path, Some(token), None).await;
            assert_eq!(
                refused.status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path}"
            );
            assert_eq!(refused.json()["error"]["code"], "METHOD_NOT_ALLOWED");
        }
    }
}

/// The worker records a failed attempt on the subscription (since when it fails); what the API
/// changed while the attempt was in flight must survive that.
#[tokio::test]
async fn a_rotation_during_a_failing_attempt_is_kept() {
    let Some(store) = store("rotate_in_flight").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "attempt_timeout = \"1s\"\n"))
        .router()
        .unwrap();
    let mut receiver = Receiver::start(Reply::status(204), vec![Reply::Hang]).await;
    let subscription = subscribe(&router, &receiver.url, &["execution.finished"]).await;
    echo(&router, Some(PLAIN), Some("req-in-flight")).await;
    receiver.next().await;
    let path = format!("{SUBSCRIPTIONS}/{}/rotate-secret", id(&subscription));
    let rotated = call(&router, "POST", &path, Some(ROOT), None).await;
    assert_eq!(rotated.status, StatusCode::OK);
    let new = secret(&rotated.json());

    // The attempt times out, and the retry is signed with both secrets.
    let retry = receiver.next().await;
    assert!(retry.signed_by(&new), "{retry:?}");
    assert!(retry.signed_by(&secret(&subscription)), "{retry:?}");
}

#[tokio::test]
async fn a_subscription_deleted_during_a_failing_attempt_stays_deleted() {
    let Some(store) = store("delete_in_flight").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "attempt_timeout = \"1s\"\n"))
        .router()
        .unwrap();
    let mut receiver = Receiver::start(Reply::Hang, Vec::new()).await;
    let subscription = subscribe(&router, &receiver.url, &["execution.finished"]).await;
    echo(&router, Some(PLAIN), Some("req-deleted")).await;
    receiver.next().await;
    let path = format!("{SUBSCRIPTIONS}/{}", id(&subscription));
    let deleted = call(&router, "DELETE", &path, Some(ROOT), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);

    // Past the attempt's timeout: nothing brought it back, nothing retried.
    receiver.nothing_for(Duration::from_secs(3)).await;
    let read = call(&router, "GET", &path, Some(ROOT), None).await;
    assert_eq!(read.status, StatusCode::NOT_FOUND, "{}", read.json());
    let listed = call(&router, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    assert_eq!(listed.json()["subscriptions"], json!([]));
}

/// Many deliveries hanging on one receiver (more than the worker makes at once) must not take
/// every attempt slot from the others.
#[tokio::test]
async fn many_deliveries_hanging_on_a_slow_receiver_do_not_starve_another() {
    let Some(store) = store("starved").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "attempt_timeout = \"60s\"\n"))
        .router()
        .unwrap();
    let mut slow = Receiver::start(Reply::Hang, Vec::new()).await;
    let mut fast = Receiver::ok().await;
    subscribe(&router, &slow.url, &["execution.finished"]).await;
    subscribe(&router, &fast.url, &["execution.finished"]).await;
    let calls = 80;
    for n in 0..calls {
        let answer = echo(&router, Some(PLAIN), Some(&format!("req-many-{n}"))).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    let began = Instant::now();
    for _ in 0..calls {
        fast.next().await;
    }
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
    slow.next().await;
}

/// A replayed request is the same execution: it finished once, and is announced once.
#[tokio::test]
async fn a_replayed_request_is_announced_once() {
    let Some(store) = store("replayed").await else {
        return;
    };
    let router = app(&store, &events_table(SHORT, "")).router().unwrap();
    let mut receiver = Receiver::ok().await;
    subscribe(&router, &receiver.url, &["execution.finished"]).await;
    let first = echo(&router, Some(PLAIN), Some("req-twice")).await;
    let again = echo(&router, Some(PLAIN), Some("req-twice")).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.json()["execution_id"], first.json()["execution_id"]);
    let delivery = receiver.next().await;
    assert_eq!(
        delivery.json()["data"]["execution_id"],
        first.json()["execution_id"]
    );
    receiver.nothing_for(Duration::from_secs(2)).await;
}

/// The guard runs again at every attempt: a subscription made while loopback was allowed gets
/// nothing once a reload stops allowing it, and its log says why.
#[tokio::test]
async fn every_attempt_is_checked_against_the_networks_in_force() {
    let Some(store) = store("recheck").await else {
        return;
    };
    let dir = TempDir::new("webhooks-recheck");
    let path = dir.0.join("carmy.toml");
    std::fs::write(
        &path,
        format!("{}\n{}", tokens(), events_table(&["1h"], "")),
    )
    .unwrap();
    let router = tools::app(&Probe::default())
        .store(Arc::clone(&store))
        .config_file(&path)
        .unwrap()
        .router()
        .unwrap();
    let mut receiver = Receiver::ok().await;
    let subscription = subscribe(&router, &receiver.url, &["execution.finished"]).await;

    let staged = dir.0.join(".carmy.toml.swp");
    let closed = "[events]\nallow_http = true\nretry_schedule = [\"1h\"]\n";
    std::fs::write(&staged, format!("{}\n{closed}", tokens())).unwrap();
    std::fs::rename(&staged, &path).unwrap();
    let reloaded = call(&router, "POST", "/agent/admin/reload", Some(ROOT), None).await;
    assert_eq!(reloaded.status, StatusCode::OK, "{}", reloaded.json());

    echo(&router, Some(PLAIN), Some("req-refused")).await;
    eventually("the refused attempt logged", async || {
        !attempts(&router, id(&subscription)).await.is_empty()
    })
    .await;
    let logged = attempts(&router, id(&subscription)).await;
    assert!(logged[0]["status_code"].is_null(), "{logged:?}");
    assert!(
        logged[0]["error"]
            .as_str()
            .is_some_and(|error| error.contains("127.0.0.1")),
        "{logged:?}"
    );
    receiver.nothing_for(Duration::from_secs(1)).await;
}

/// A system without root certificates (a `scratch` image) still serves: the example as shipped
/// (`CARMY_SHOP_BIN`) starts with `SSL_CERT_FILE` and `SSL_CERT_DIR` naming nothing (where the
/// platform's roots are then read from), takes a subscription, and its attempts fail, logged
/// with the reason, with nothing sent. The roots are read at the first attempt, not at start.
#[tokio::test(flavor = "multi_thread")]
async fn without_root_certificates_the_example_starts_and_its_attempts_say_why() {
    let Some(program) = server_url("CARMY_SHOP_BIN") else {
        return;
    };
    let dir = TempDir::new("no-root-certificates");
    let (no_file, no_dir) = (dir.0.join("none.pem"), dir.0.join("none"));
    let shop = carmy_tests::ShippedShop::start(
        program.as_ref(),
        &[
            ("SSL_CERT_FILE", no_file.as_os_str()),
            ("SSL_CERT_DIR", no_dir.as_os_str()),
            ("CARMY_EVENTS_ALLOW_HTTP", "true".as_ref()),
            ("CARMY_EVENTS_ALLOW_NETWORKS", "127.0.0.0/8".as_ref()),
        ],
    )
    .await;
    let internal = "Bearer shop-internal-demo-token";
    let to_shop = async |method: &str, path: &str, body: Option<Value>| {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", shop.addr.to_string())
            .header("authorization", internal)
            .header("content-type", "application/json");
        let body = body.map_or_else(Body::empty, |body| Body::from(body.to_string()));
        carmy_tests::send_to(shop.addr, request.body(body).unwrap()).await
    };
    let live = to_shop("GET", "/agent/health/live", None).await;
    assert_eq!(
        live.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&live.body)
    );

    let mut receiver = Receiver::ok().await;
    let created = to_shop(
        "POST",
        SUBSCRIPTIONS,
        Some(json!({ "url": receiver.url, "event_types": ["execution.finished"] })),
    )
    .await;
    assert_eq!(
        created.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let deliveries = format!("{SUBSCRIPTIONS}/{}/deliveries", id(&created.json()));
    let placed = to_shop(
        "POST",
        "/agent/execute",
        Some(json!({
            "tool": "create_order",
            "arguments": { "sku": "KB-01" },
            "request_id": "no-roots-1",
        })),
    )
    .await;
    assert_eq!(
        placed.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&placed.body)
    );

    let mut logged = Vec::new();
    eventually("a failed attempt", async || {
        logged = to_shop("GET", &deliveries, None).await.json()["deliveries"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        !logged.is_empty()
    })
    .await;
    let attempt = &logged[0];
    assert!(attempt["status_code"].is_null(), "{attempt}");
    let error = attempt["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("webhook delivery cannot start: no root certificates found"),
        "{attempt}"
    );
    receiver.nothing_for(Duration::from_secs(1)).await;
}
