//! A host implements the key contract alone (here a map under a lock) and gives it to
//! `App::key_store`: its idempotency records live there, while executions and events come from
//! the in-memory engine the app makes for the concerns it was not given.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use bytes::Bytes;
use carmy::auth::hash_token;
use carmy::store::{
    Fingerprint, Finish, IdempotencyKey, KeyStore, Reservation, StoreError, StoredResponse,
};
use carmy_tests::{Answer, Server, execute_request, request, send};
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::tools::{self, Probe};

/// A key store kept in a map: records never expire, and a duplicate of a running call polls.
#[derive(Default)]
struct MapKeys {
    records: Mutex<HashMap<IdempotencyKey, Record>>,
    reservations: AtomicUsize,
}

struct Record {
    fingerprint: Fingerprint,
    execution_id: Arc<str>,
    /// `None` while it runs.
    ended: Option<Ended>,
}

enum Ended {
    Answered(StoredResponse),
    Uncertain,
}

impl MapKeys {
    fn holds(&self, caller: &str, request_id: &str) -> bool {
        let key = IdempotencyKey::new(caller, request_id);
        self.records.lock().unwrap().contains_key(&key)
    }
}

impl KeyStore for MapKeys {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        _lease: Duration,
        _ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        self.reservations.fetch_add(1, Ordering::SeqCst);
        let mut records = self.records.lock().unwrap();
        let reservation = match records.get(key) {
            None => {
                let record = Record {
                    fingerprint: fingerprint.clone(),
                    execution_id: Arc::clone(execution_id),
                    ended: None,
                };
                records.insert(key.clone(), record);
                Reservation::Reserved
            }
            Some(record) if record.fingerprint != *fingerprint => Reservation::Conflict {
                tool: Arc::clone(&record.fingerprint.tool),
            },
            Some(record) => match &record.ended {
                None => Reservation::Running {
                    execution_id: Arc::clone(&record.execution_id),
                    changed: Box::pin(tokio::time::sleep(Duration::from_millis(10))),
                },
                Some(Ended::Answered(response)) => Reservation::Finished(response.clone()),
                Some(Ended::Uncertain) => Reservation::Uncertain {
                    execution_id: Arc::clone(&record.execution_id),
                },
            },
        };
        Box::pin(std::future::ready(Ok(reservation)))
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish<'a>,
        _ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut records = self.records.lock().unwrap();
        if let Some(record) = records.get_mut(key)
            && record.execution_id == *finish.execution_id()
            && !matches!(record.ended, Some(Ended::Answered(_)))
        {
            record.ended = Some(match finish {
                Finish::Response(response) => Ended::Answered(response.clone()),
                Finish::Uncertain { .. } => Ended::Uncertain,
            });
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let mut records = self.records.lock().unwrap();
        if records
            .get(key)
            .is_some_and(|record| *record.execution_id == *execution_id)
        {
            records.remove(key);
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        Box::pin(std::future::ready(Ok(0)))
    }
}

#[tokio::test]
async fn a_host_key_store_keeps_the_key_contract() {
    super::keys::lifecycle(&MapKeys::default()).await;
}

/// `internal`: manages the subscriptions.
const ROOT: &str = "custom-store-root";
const AS_ROOT: (&str, &str) = ("authorization", "Bearer custom-store-root");
/// `known`: its executions are kept for it.
const ALICE: &str = "custom-store-alice";
const AS_ALICE: (&str, &str) = ("authorization", "Bearer custom-store-alice");

/// Far more than a delivery or an execution here takes (the worker polls every half second).
const WITHIN: Duration = Duration::from_secs(15);

/// The two tokens and an `[events]` table for a receiver on loopback.
fn config() -> carmy::config::Config {
    let text = format!(
        "[[tokens]]\nid = \"root\"\ntrust = \"internal\"\nhash = \"{}\"\n\n\
         [[tokens]]\nid = \"alice\"\ntrust = \"known\"\nhash = \"{}\"\n\n\
         [events]\nallow_http = true\nallow_networks = [\"127.0.0.0/8\"]\n\
         retry_schedule = [\"200ms\"]\n",
        hash_token(ROOT),
        hash_token(ALICE)
    );
    carmy::config::Config::parse(&text, |_| None).unwrap()
}

async fn call(router: &Router, body: &Value, headers: &[(&str, &str)]) -> Answer {
    send(router, execute_request(body, headers)).await
}

/// A receiver on loopback answering `204`, and the bodies it was sent.
async fn receiver() -> (Server, mpsc::UnboundedReceiver<Bytes>) {
    let (sender, received) = mpsc::unbounded_channel();
    let router = Router::new().fallback(move |body: Bytes| {
        let _ = sender.send(body);
        std::future::ready(StatusCode::NO_CONTENT)
    });
    (Server::start(router).await, received)
}

#[tokio::test]
async fn a_host_key_store_alone_serves_retries_and_memory_keeps_executions_and_events() {
    let keys = Arc::new(MapKeys::default());
    let probe = Probe::default();
    let router = tools::app(&probe)
        .tool(crate::executions::detached::TOOL)
        .key_store(Arc::clone(&keys))
        .config(config())
        .router()
        .unwrap();

    // Events: a subscription made through the API, kept by the in-memory engine.
    let (server, mut received) = receiver().await;
    let subscribe = axum::http::Request::post("/agent/events/subscriptions")
        .header(AS_ROOT.0, AS_ROOT.1)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(
            json!({
                "url": format!("http://{}/hooks", server.addr),
                "event_types": ["execution.finished"],
            })
            .to_string(),
        ))
        .unwrap();
    let created = send(&router, subscribe).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.json());

    // Keys: the record is the host's, and a retry replays it without running the tool again.
    let counted = json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": "k-1" });
    let first = call(&router, &counted, &[AS_ALICE]).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.json());
    assert!(
        keys.holds("alice", "k-1"),
        "the host's store holds the record"
    );
    let again = call(&router, &counted, &[AS_ALICE]).await;
    assert_eq!(again.header("carmy-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(probe.runs(), 1);
    assert_eq!(keys.reservations.load(Ordering::SeqCst), 2);

    // Executions: an async one is kept in memory and read back by its caller.
    let detached = json!({ "tool": "detached", "arguments": { "reports": 0, "millis": 50 } });
    let accepted = call(&router, &detached, &[AS_ALICE]).await;
    assert_eq!(accepted.status, StatusCode::ACCEPTED, "{}", accepted.json());
    let detached_id = accepted.json()["execution_id"].as_str().unwrap().to_owned();
    let location = format!("/agent/executions/{detached_id}");
    let deadline = tokio::time::Instant::now() + WITHIN;
    let ended = loop {
        let answer = send(&router, request("GET", &location, &[AS_ALICE])).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
        if answer.json()["status"] != "running" {
            break answer;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still running after {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(ended.json()["status"], "completed", "{}", ended.json());
    assert_eq!(ended.json()["data"], json!({ "reports": 0 }));
    assert_eq!(keys.reservations.load(Ordering::SeqCst), 2, "no request_id");

    // Both ended executions were published through the in-memory outbox.
    let mut expected = HashSet::from([
        first.json()["execution_id"].as_str().unwrap().to_owned(),
        detached_id,
    ]);
    while !expected.is_empty() {
        let body = tokio::time::timeout(WITHIN, received.recv())
            .await
            .unwrap_or_else(|_| panic!("no delivery within {WITHIN:?}; waiting for {expected:?}"))
            .unwrap();
        let event: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(event["type"], "execution.finished", "{event}");
        let id = event["data"]["execution_id"].as_str().unwrap();
        assert!(expected.remove(id), "unexpected event {event}");
    }
}
