//! Health and readiness (protocol.md §6): the state machine, the cached checks, the three
//! probes, and readiness on shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::auth::{TokenAuthenticator, hash_token};
use carmy::health::{HealthChanged, HealthState, TransitionError};
use carmy::protection::RateLimit;
use carmy::store::{
    Fingerprint, Finish, IdempotencyKey, KeyStore, MemoryStore, Reservation, StoreError,
};
use carmy::{Context, Principal, ToolError, TrustLevel};
use carmy_tests::wait::{PATIENCE, eventually, within};
use carmy_tests::{Proxy, Serving, execute, get, get_as, send, server_url, split_authority};
use futures_util::future::BoxFuture;
use serde_json::{Value, json};

use crate::tools::{self, Probe, Text};

const KNOWN_TOKEN: &str = "health-known-token-0123456789";
const INTERNAL_TOKEN: &str = "health-internal-token-0123456789";

fn tokens() -> TokenAuthenticator {
    TokenAuthenticator::new()
        .token(
            &hash_token(KNOWN_TOKEN),
            Principal::new("reporting", TrustLevel::Known),
        )
        .unwrap()
        .token(
            &hash_token(INTERNAL_TOKEN),
            Principal::new("operator", TrustLevel::Internal),
        )
        .unwrap()
}

async fn health_report(router: &Router) -> (StatusCode, Value) {
    let answer = get(router, "/agent/health").await;
    assert_eq!(
        answer.header("content-type"),
        Some("application/health+json")
    );
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    (answer.status, answer.json())
}

async fn verbose_ready(router: &Router) -> (StatusCode, String) {
    let answer = get(router, "/agent/health/ready?verbose").await;
    assert_eq!(
        answer.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    let text = String::from_utf8(answer.body.to_vec()).unwrap();
    (answer.status, text)
}

/// Polls readiness until it answers `status`, or fails the test after 5 s.
async fn wait_ready(router: &Router, status: StatusCode) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (answer, text) = verbose_ready(router).await;
        if answer == status {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "readiness stayed {answer}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_healthy_service_answers_pass() {
    let router = tools::app(&Probe::default()).router().unwrap();
    let (status, body) = health_report(&router).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "pass");
    assert_eq!(body["state"], "healthy");
    assert!(body.get("reason").is_none(), "{body}");
    // Nothing outside the process to check: only the configuration.
    assert_eq!(body["checks"], json!({ "config": { "status": "pass" } }));
    let since = body["since"].as_str().unwrap();
    let since = humantime::parse_rfc3339(since).expect("since is RFC 3339");
    let age = std::time::SystemTime::now().duration_since(since).unwrap();
    assert!(age < Duration::from_secs(60), "{age:?}");

    let live = get(&router, "/agent/health/live").await;
    assert_eq!(live.status, StatusCode::OK);
    assert_eq!(&live.body[..], b"ok\n");
    let ready = get(&router, "/agent/health/ready").await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(&ready.body[..], b"ok\n");
    assert_eq!(
        verbose_ready(&router).await,
        (
            StatusCode::OK,
            "[+]config ok\n[+]state ok\n[+]shutdown ok\n".to_owned()
        )
    );
}

#[tokio::test]
async fn discovery_lists_health() {
    let router = tools::app(&Probe::default()).router().unwrap();
    let discovery = get(&router, "/.well-known/agent").await.json();
    assert!(
        discovery["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("health")),
        "{discovery}"
    );
    assert_eq!(discovery["health_url"], "/agent/health");
}

#[tokio::test]
async fn the_host_moves_the_state_machine() {
    let app = tools::app(&Probe::default());
    let health = app.health();
    let mut events = health.subscribe();
    let router = app.router().unwrap();

    // healthy → degraded directly is refused, and changes nothing.
    assert_eq!(
        health.report_degraded("on fire"),
        Err(TransitionError {
            from: HealthState::Healthy,
            to: HealthState::Degraded
        })
    );
    let (status, body) = health_report(&router).await;
    assert_eq!(
        (status, &body["state"]),
        (StatusCode::OK, &json!("healthy"))
    );
    let first_since = body["since"].clone();

    // healthy → degrading: warn, still 200 and ready.
    health.report_degrading("payments slow").unwrap();
    let (status, body) = health_report(&router).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "warn");
    assert_eq!(body["state"], "degrading");
    assert_eq!(body["reason"], "payments slow");
    assert_ne!(body["since"], first_since);
    assert_eq!(
        get(&router, "/agent/health/ready").await.status,
        StatusCode::OK
    );
    // Reporting the current state again is no transition.
    health.report_degrading("payments slow").unwrap();

    // degrading → degraded: fail, 503, not ready.
    health.report_degraded("payments down").unwrap();
    let (status, body) = health_report(&router).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body["status"], "fail");
    assert_eq!(body["state"], "degraded");
    assert_eq!(body["reason"], "payments down");
    assert_eq!(
        verbose_ready(&router).await,
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "[+]config ok\n[-]state failed\n[+]shutdown ok\n".to_owned()
        )
    );
    let ready = get(&router, "/agent/health/ready").await;
    assert_eq!(
        (ready.status, &ready.body[..]),
        (StatusCode::SERVICE_UNAVAILABLE, &b"failed\n"[..])
    );
    // Liveness does not care.
    assert_eq!(
        get(&router, "/agent/health/live").await.status,
        StatusCode::OK
    );

    // degraded → degrading is refused.
    assert_eq!(
        health.report_degrading("better"),
        Err(TransitionError {
            from: HealthState::Degraded,
            to: HealthState::Degrading
        })
    );

    // degraded → healthy, then degrading → healthy.
    health.report_healthy().unwrap();
    let (status, body) = health_report(&router).await;
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("pass")));
    assert!(body.get("reason").is_none(), "{body}");
    health.report_degrading("again").unwrap();
    health.report_healthy().unwrap();
    assert_eq!(health.state(), HealthState::Healthy);

    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push((event.from, event.to, event.reason));
    }
    use HealthState::{Degraded, Degrading, Healthy};
    assert_eq!(
        seen,
        [
            (Healthy, Degrading, Some("payments slow".to_owned())),
            (Degrading, Degraded, Some("payments down".to_owned())),
            (Degraded, Healthy, None),
            (Healthy, Degrading, Some("again".to_owned())),
            (Degrading, Healthy, None),
        ]
    );
    assert_eq!(HealthChanged::NAME, "health.changed");
}

/// Reports `degrading`, or `degraded` when `text` is `degraded`, from inside a tool.
#[carmy::tool(effect = "write", idempotent = false, register = false)]
async fn report(ctx: Context, input: Text) -> Result<Text, ToolError> {
    let health = ctx.health();
    let reported = if input.text == "degraded" {
        health.report_degraded("a tool gave up")
    } else {
        health.report_degrading(input.text.clone())
    };
    reported.map_err(|error| ToolError::conflict("INVALID_TRANSITION", error.to_string()))?;
    Ok(Text {
        text: health.state().as_str().to_owned(),
    })
}

#[tokio::test]
async fn a_tool_moves_the_state_machine_through_its_context() {
    let app = tools::app(&Probe::default()).tool(report::TOOL);
    let mut events = app.health().subscribe();
    let router = app.router().unwrap();
    let call = |text: &str| json!({ "tool": "report", "arguments": { "text": text } });

    let refused = execute(&router, &call("degraded")).await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{:?}", refused.body);
    assert_eq!(refused.json()["error"]["code"], "INVALID_TRANSITION");

    let answer = execute(&router, &call("cache cold")).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["data"]["text"], "degrading");
    let (_, body) = health_report(&router).await;
    assert_eq!(body["state"], "degrading");
    assert_eq!(body["reason"], "cache cold");

    let answer = execute(&router, &call("degraded")).await;
    assert_eq!(answer.json()["data"]["text"], "degraded");
    assert_eq!(
        health_report(&router).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(events.try_recv().unwrap().to, HealthState::Degrading);
    assert_eq!(events.try_recv().unwrap().to, HealthState::Degraded);
}

#[tokio::test]
async fn probes_spend_no_rate_limit_budget() {
    let probe = Probe::default();
    let router = tools::app(&probe)
        .rate_limit(
            TrustLevel::Anonymous,
            RateLimit {
                requests: 3,
                window: Duration::from_secs(60),
            },
        )
        .router()
        .unwrap();
    let paths = [
        "/agent/health",
        "/agent/health/live",
        "/agent/health/ready",
        "/agent/health/ready?verbose",
    ];
    for n in 0..50 {
        let answer = get(&router, paths[n % paths.len()]).await;
        assert_eq!(answer.status, StatusCode::OK, "probe {n}");
    }
    // The whole budget is still there: three calls pass, the fourth is limited.
    let call = json!({ "tool": "echo", "arguments": { "text": "a" } });
    for n in 0..3 {
        assert_eq!(execute(&router, &call).await.status, StatusCode::OK, "{n}");
    }
    assert_eq!(
        execute(&router, &call).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Probes still answer once the budget is spent.
    assert_eq!(
        get(&router, "/agent/health/ready").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn other_methods_on_probes_are_json_405() {
    let router = tools::app(&Probe::default()).router().unwrap();
    let answer = send(
        &router,
        Request::post("/agent/health").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.json()["error"]["code"], "METHOD_NOT_ALLOWED");
}

/// A shared store whose server the test can take away: records live in memory, the ping
/// fails while `down`.
#[derive(Clone, Default)]
struct Flaky {
    records: Arc<MemoryStore>,
    down: Arc<AtomicBool>,
    pings: Arc<AtomicU64>,
}

impl KeyStore for Flaky {
    fn reserve<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        fingerprint: &'a Fingerprint,
        execution_id: &'a Arc<str>,
        lease: Duration,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Reservation, StoreError>> {
        self.records
            .reserve(key, fingerprint, execution_id, lease, ttl)
    }

    fn finish<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        finish: Finish<'a>,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.records.finish(key, finish, ttl)
    }

    fn release<'a>(
        &'a self,
        key: &'a IdempotencyKey,
        execution_id: &'a str,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.records.release(key, execution_id)
    }

    fn purge_expired(&self) -> BoxFuture<'_, Result<usize, StoreError>> {
        self.records.purge_expired()
    }

    fn ping(&self) -> Option<BoxFuture<'_, Result<(), StoreError>>> {
        self.pings.fetch_add(1, Ordering::SeqCst);
        let result = if self.down.load(Ordering::SeqCst) {
            Err(StoreError::message("connection refused by db-7"))
        } else {
            Ok(())
        };
        Some(Box::pin(std::future::ready(result)))
    }
}

#[tokio::test]
async fn a_failing_store_fails_readiness_and_recovers() {
    let store = Flaky::default();
    store.down.store(true, Ordering::SeqCst);
    let app = tools::app(&Probe::default())
        .authenticator(tokens())
        .key_store(store.clone())
        .health_check_interval(Duration::from_millis(20));
    let mut events = app.health().subscribe();
    let router = app.router().unwrap();

    let text = wait_ready(&router, StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(text.contains("[-]idempotency failed\n"), "{text}");
    assert!(text.contains("[+]config ok\n"), "{text}");
    let changed = within(PATIENCE, "a health change", events.recv())
        .await
        .unwrap();
    assert_eq!(
        (changed.from, changed.to),
        (HealthState::Healthy, HealthState::Degrading)
    );
    assert_eq!(changed.reason.as_deref(), Some("failing: idempotency"));

    // The state machine moved to degrading: the report still answers 200 (warn).
    let (status, body) = health_report(&router).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["status"], "warn");
    assert_eq!(body["reason"], "failing: idempotency");
    let check = &body["checks"]["idempotency"];
    assert_eq!(check["status"], "fail");
    assert!(check["observed_ms"].is_u64(), "{body}");

    // The error's text only for internal callers.
    for token in [None, Some(KNOWN_TOKEN)] {
        let body = get_as(&router, "/agent/health", token).await.json();
        assert_eq!(body["checks"]["idempotency"]["status"], "fail");
        assert!(
            body["checks"]["idempotency"].get("output").is_none(),
            "{token:?}: {body}"
        );
    }
    let body = get_as(&router, "/agent/health", Some(INTERNAL_TOKEN))
        .await
        .json();
    let output = body["checks"]["idempotency"]["output"].as_str().unwrap();
    assert!(output.contains("connection refused by db-7"), "{output}");

    store.down.store(false, Ordering::SeqCst);
    let text = wait_ready(&router, StatusCode::OK).await;
    assert!(text.contains("[+]idempotency ok\n"), "{text}");
    let recovered = within(PATIENCE, "a health change", events.recv())
        .await
        .unwrap();
    assert_eq!(
        (recovered.from, recovered.to),
        (HealthState::Degrading, HealthState::Healthy)
    );
    let (_, body) = health_report(&router).await;
    assert_eq!(body["state"], "healthy");
    assert_eq!(body["checks"]["idempotency"]["status"], "pass");
}

#[tokio::test]
async fn checks_are_cached_and_one_failure_only_warns() {
    let store = Flaky::default();
    store.down.store(true, Ordering::SeqCst);
    let router = tools::app(&Probe::default())
        .key_store(store.clone())
        .health_check_interval(Duration::from_secs(3600))
        .router()
        .unwrap();
    // The first round runs at start; the next one is an hour away.
    eventually(PATIENCE, "a check runs", async || {
        health_report(&router).await.1["checks"]
            .get("idempotency")
            .is_some()
    })
    .await;
    for _ in 0..20 {
        let (status, body) = health_report(&router).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["state"], "healthy");
        assert_eq!(body["checks"]["idempotency"]["status"], "warn");
        let (status, text) = verbose_ready(&router).await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(text.contains("[+]idempotency ok\n"), "{text}");
    }
    // 1 ping to learn that the store has something to check, 1 for the first round; probes
    // ran none.
    assert_eq!(store.pings.load(Ordering::SeqCst), 2);
}

async fn a_real_store_going_away_fails_readiness(url: &str) {
    let (target, with_authority) = split_authority(url);
    let proxy = Proxy::start(target).await;
    let store = carmy::store::connect(&with_authority(proxy.addr))
        .await
        .unwrap();
    let router = tools::app(&Probe::default())
        .store(store)
        .health_check_interval(Duration::from_millis(50))
        .router()
        .unwrap();
    eventually(PATIENCE, "the store's check passes", async || {
        health_report(&router).await.1["checks"]["idempotency"]["status"] == "pass"
    })
    .await;
    assert!(
        verbose_ready(&router)
            .await
            .1
            .contains("[+]idempotency ok\n")
    );
    proxy.close().await;
    let text = wait_ready(&router, StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(text.contains("[-]idempotency failed\n"), "{text}");
}

#[tokio::test]
async fn postgres_going_away_fails_readiness() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    a_real_store_going_away_fails_readiness(&url).await;
}

#[tokio::test]
async fn redis_going_away_fails_readiness() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    a_real_store_going_away_fails_readiness(&url).await;
}

#[tokio::test]
async fn a_shared_rate_limiter_going_away_fails_readiness() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    let (target, with_authority) = split_authority(&url);
    let proxy = Proxy::start(target).await;
    let limiter = carmy::protection::RedisRateLimiter::connect(&with_authority(proxy.addr))
        .await
        .unwrap();
    let router = tools::app(&Probe::default())
        .rate_limiter(limiter)
        .rate_limit(
            TrustLevel::Anonymous,
            RateLimit {
                requests: 1_000,
                window: Duration::from_secs(60),
            },
        )
        .health_check_interval(Duration::from_millis(50))
        .router()
        .unwrap();
    eventually(PATIENCE, "the rate limiter's check passes", async || {
        health_report(&router).await.1["checks"]["rate_limit"]["status"] == "pass"
    })
    .await;
    proxy.close().await;
    let text = wait_ready(&router, StatusCode::SERVICE_UNAVAILABLE).await;
    assert!(text.contains("[-]rate_limit failed\n"), "{text}");
}

async fn ready_at(addr: std::net::SocketAddr) -> StatusCode {
    let request = Request::get("/agent/health/ready")
        .header("host", addr.to_string())
        .body(Body::empty())
        .unwrap();
    carmy_tests::send_to(addr, request).await.status
}

#[tokio::test]
async fn readiness_fails_at_once_on_shutdown_while_executions_finish() {
    let probe = Probe::default();
    let drain = Duration::from_millis(600);
    let app = tools::app(&probe)
        .shutdown_grace(Duration::from_secs(5))
        .drain_delay(drain);
    let mut server = Serving::start(app).await;
    let addr = server.addr;
    assert_eq!(ready_at(addr).await, StatusCode::OK);

    let call = json!({ "tool": "slow_write", "arguments": { "millis": 400 } });
    let in_flight = tokio::spawn(async move { carmy_tests::execute_at(addr, &call).await });
    probe.wait_runs(1).await;
    let stopping = tokio::time::Instant::now();
    server.stop();
    // The listener still answers, and says not to send traffic.
    let deadline = stopping + Duration::from_secs(1);
    loop {
        let status = ready_at(addr).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        assert_eq!(status, StatusCode::OK);
        assert!(tokio::time::Instant::now() < deadline, "still ready");
    }
    let live = Request::get("/agent/health/live")
        .header("host", addr.to_string())
        .body(Body::empty())
        .unwrap();
    assert_eq!(
        carmy_tests::send_to(addr, live).await.status,
        StatusCode::OK
    );

    let answer = within(PATIENCE, "the call in flight answers", in_flight)
        .await
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json()["status"], "completed");
    server.ended(PATIENCE).await;
    assert!(stopping.elapsed() >= drain, "{:?}", stopping.elapsed());
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer accepting"
    );
}
