//! Events delivered to real receivers on loopback (`protocol.md` §8): signed as a Standard
//! Webhooks consumer verifies them, in the outbox before the call is answered, retried under
//! one `webhook-id`, signed by both secrets after a rotation, checked at every attempt against
//! the networks in force; health and catalog changes announced.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::store::Engine;
use carmy::webhook::SigningSecret;
use carmy::webhook::verify;
use carmy_tests::{TempDir, bearer, execute_request, send, server_url};
use serde_json::{Value, json};

use crate::tools::{self, Probe};
use crate::webhooks::{
    MANAGER, PLAIN, ROOT, Receiver, Reply, SHORT, SUBSCRIPTIONS, app, assert_signed_event,
    attempts, call, down_url, echo, events_table, eventually, id, postgres, read_subscription,
    secret, store, subscribe, tokens,
};

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
