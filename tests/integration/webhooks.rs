//! Signed outbound event webhooks (`protocol.md` §8), end to end: what the tests of
//! `webhook_subscriptions`, `webhook_deliveries`, `webhook_receivers` and `webhook_bounds`
//! share. An app with events on and its outbox in a store, subscriptions made through the API,
//! real receivers on loopback that record each request and answer as scripted, and the checks
//! a Standard Webhooks consumer makes of what it receives.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use carmy::auth::hash_token;
use carmy::store::Engine;
use carmy::webhook::SigningSecret;
use carmy::webhook::verify;
use carmy_tests::{Answer, Server, execute_as, server_url};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::tools::{self, Probe};

/// `internal`.
pub(crate) const ROOT: &str = "root-token";

/// `known`, with `manage:events`.
pub(crate) const MANAGER: &str = "manager-token";

/// `known`, without it.
pub(crate) const PLAIN: &str = "plain-token";

pub(crate) const SUBSCRIPTIONS: &str = "/agent/events/subscriptions";

/// The generous bound of "eventually delivered": the worker polls every half second.
pub(crate) const DELIVERED_WITHIN: Duration = Duration::from_secs(15);

pub(crate) fn tokens() -> String {
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
pub(crate) const SHORT: &[&str] = &["200ms", "400ms"];

/// The store a test's app keeps its outbox in: PostgreSQL, in a schema of the test's own (each
/// app's worker delivers everything in its outbox, so two tests must never share one). `None`
/// (the test is skipped) without `CARMY_TEST_POSTGRES_URL`.
pub(crate) async fn postgres(test: &str) -> Option<Arc<dyn Engine>> {
    let url = server_url("CARMY_TEST_POSTGRES_URL")?;
    let scoped = carmy_tests::postgres::fresh_schema(&url, &format!("webhooks_{test}")).await;
    Some(carmy::store::connect(&scoped).await.unwrap())
}

/// The store of the tests that do not name one: the memory store, the example's default. Async,
/// the same shape as `postgres`.
pub(crate) async fn store(_test: &str) -> Option<Arc<dyn Engine>> {
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
    let config = carmy::config::Config::parse(&format!("{}\n{events}", tokens()), |name| {
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

pub(crate) fn secret(subscription: &Value) -> SigningSecret {
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
pub(crate) async fn read_subscription(router: &Router, subscription: &Value) -> Answer {
    let path = format!("{SUBSCRIPTIONS}/{}", id(subscription));
    call(router, "GET", &path, Some(ROOT), None).await
}

/// `GET …/{id}/deliveries` as root: the attempts, newest first.
pub(crate) async fn attempts(router: &Router, subscription: &str) -> Vec<Value> {
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
pub(crate) enum Reply {
    Status(u16, Vec<(&'static str, String)>),
    /// Never answers.
    Hang,
}

impl Reply {
    pub(crate) fn status(code: u16) -> Self {
        Reply::Status(code, Vec::new())
    }
}

/// One request a receiver got, with its Standard Webhooks headers.
#[derive(Debug, Clone)]
pub(crate) struct Delivery {
    pub(crate) id: String,
    pub(crate) timestamp: u64,
    pub(crate) signature: String,
    pub(crate) content_type: String,
    pub(crate) body: bytes::Bytes,
    pub(crate) at: Instant,
}

impl Delivery {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }

    /// Whether `secret` signed it, as a consumer verifies it.
    pub(crate) fn signed_by(&self, secret: &SigningSecret) -> bool {
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
pub(crate) struct Receiver {
    pub(crate) url: String,
    pub(crate) got: mpsc::UnboundedReceiver<Delivery>,
    pub(crate) _server: Server,
}

impl Receiver {
    pub(crate) async fn start(otherwise: Reply, replies: Vec<Reply>) -> Self {
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
    pub(crate) async fn ok() -> Self {
        Self::start(Reply::status(204), Vec::new()).await
    }

    /// The next delivery, within [`DELIVERED_WITHIN`].
    pub(crate) async fn next(&mut self) -> Delivery {
        tokio::time::timeout(DELIVERED_WITHIN, self.got.recv())
            .await
            .unwrap_or_else(|_| panic!("no delivery within {DELIVERED_WITHIN:?}"))
            .unwrap()
    }

    /// Nothing arrives for `quiet`.
    pub(crate) async fn nothing_for(&mut self, quiet: Duration) {
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

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A delivery's headers and body are those of a Standard Webhooks message of type `kind`,
/// signed by `secret` for this attempt.
pub(crate) fn assert_signed_event(
    delivery: &Delivery,
    kind: &str,
    secret: &SigningSecret,
) -> Value {
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

/// A secret the tests give declared subscriptions through their environment.
pub(crate) fn declared_secret() -> SigningSecret {
    SigningSecret::from_bytes(&[7; 32]).unwrap()
}
