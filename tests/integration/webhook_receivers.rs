//! Receivers that fail, hang or are gone (`protocol.md` §8): `410 Gone` and `disable_after`
//! disable a subscription and tell the subscribers of `subscription.disabled`, what the API
//! changes during a failing attempt is kept, and a slow receiver delays neither the answers
//! nor the other subscribers.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use tokio::time::Instant;

use crate::webhooks::{
    PLAIN, ROOT, Receiver, Reply, SHORT, SUBSCRIPTIONS, app, assert_signed_event, call, echo,
    events_table, id, read_subscription, secret, store, subscribe,
};

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
