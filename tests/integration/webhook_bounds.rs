//! The bounds of event subscriptions (`protocol.md` §8): the length of a URL and of a
//! description, the number of subscriptions, the list in pages, and a full outbox said so in
//! health. Each is a refusal in the JSON envelope, never a store or an answer that grows
//! without end.

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use carmy::store::Engine;
use serde_json::{Value, json};

use crate::webhooks::{
    PLAIN, ROOT, SUBSCRIPTIONS, app, app_with_env, call, declared_secret, down_url, echo,
    events_table, eventually, id, postgres, subscribe,
};

/// The memory store, the example's default.
fn memory() -> Arc<dyn Engine> {
    Arc::new(carmy::store::MemoryStore::new())
}

/// A URL of exactly `length` bytes, on loopback (which the tests' SSRF guard allows).
fn url_of(length: usize) -> String {
    let base = "http://127.0.0.1:9/";
    format!("{base}{}", "u".repeat(length - base.len()))
}

async fn create(router: &Router, body: &Value) -> carmy_tests::Answer {
    call(router, "POST", SUBSCRIPTIONS, Some(ROOT), Some(body)).await
}

/// The error of a refusal with `status`, in the envelope.
fn refusal(answer: &carmy_tests::Answer, status: StatusCode) -> Value {
    assert_eq!(answer.status, status, "{}", answer.json());
    assert_eq!(answer.header("content-type"), Some("application/json"));
    answer.json()["error"].clone()
}

#[tokio::test]
async fn urls_and_descriptions_are_bounded() {
    let store = memory();
    let router = app(&store, &events_table(&["1h"], "")).router().unwrap();
    let types = json!(["tools.changed"]);

    let long_url = create(
        &router,
        &json!({ "url": url_of(2049), "event_types": types }),
    )
    .await;
    let error = refusal(&long_url, StatusCode::BAD_REQUEST);
    assert_eq!(error["code"], "INVALID_REQUEST");
    assert_eq!(error["details"]["field"], "url");
    assert_eq!(error["details"]["limit_bytes"], 2048);
    assert!(long_url.body.len() < 1024, "the URL is not echoed");
    // A URL of 900 KB, as fits in a body, is refused before it is resolved or kept.
    let huge = create(
        &router,
        &json!({ "url": url_of(900_000), "event_types": types }),
    )
    .await;
    assert_eq!(
        refusal(&huge, StatusCode::BAD_REQUEST)["details"]["field"],
        "url"
    );
    assert!(huge.body.len() < 1024);

    let description = "d".repeat(1025);
    let long_description = create(
        &router,
        &json!({ "url": url_of(40), "event_types": types, "description": description }),
    )
    .await;
    let error = refusal(&long_description, StatusCode::BAD_REQUEST);
    assert_eq!(error["details"]["field"], "description");
    assert_eq!(error["details"]["limit_bytes"], 1024);

    // An unknown event type is named, clipped.
    let unknown = create(
        &router,
        &json!({ "url": url_of(40), "event_types": ["x".repeat(100_000)] }),
    )
    .await;
    assert_eq!(
        refusal(&unknown, StatusCode::BAD_REQUEST)["code"],
        "INVALID_REQUEST"
    );
    assert!(unknown.body.len() < 2048, "{} bytes", unknown.body.len());

    let listed = call(&router, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    assert_eq!(
        listed.json()["subscriptions"],
        json!([]),
        "nothing refused is kept"
    );

    // At the bounds, accepted.
    let at_bounds = create(
        &router,
        &json!({ "url": url_of(2048), "event_types": types, "description": "d".repeat(1024) }),
    )
    .await;
    assert_eq!(
        at_bounds.status,
        StatusCode::CREATED,
        "{}",
        at_bounds.json()
    );
    let path = format!("{SUBSCRIPTIONS}/{}", id(&at_bounds.json()));
    let patched = call(
        &router,
        "PATCH",
        &path,
        Some(ROOT),
        Some(&json!({ "description": description })),
    )
    .await;
    assert_eq!(
        refusal(&patched, StatusCode::BAD_REQUEST)["details"]["field"],
        "description"
    );
    let read = call(&router, "GET", &path, Some(ROOT), None).await;
    assert_eq!(read.json()["description"], json!("d".repeat(1024)));
}

/// `max_subscriptions` made through the API are kept, then `409 SUBSCRIPTION_LIMIT_REACHED`
/// until one is deleted, also when many are created at once; those the file declares are
/// not counted.
#[tokio::test]
async fn the_number_of_subscriptions_is_bounded() {
    let store = memory();
    let declared = "max_subscriptions = 3\n[[events.subscriptions]]\nurl = \"http://127.0.0.1:9/declared\"\nevent_types = [\"tools.changed\"]\nsecret_env = \"HOOKS_SECRET\"\n";
    let whsec = declared_secret().to_whsec();
    let router = app_with_env(
        &store,
        &events_table(&["1h"], declared),
        &[("HOOKS_SECRET", &whsec)],
    )
    .router()
    .unwrap();
    let mut made = Vec::new();
    for _ in 0..3 {
        made.push(subscribe(&router, &url_of(40), &["tools.changed"]).await);
    }
    let body = json!({ "url": url_of(40), "event_types": ["tools.changed"] });
    let refused = create(&router, &body).await;
    let error = refusal(&refused, StatusCode::CONFLICT);
    assert_eq!(error["code"], "SUBSCRIPTION_LIMIT_REACHED");
    assert_eq!(error["category"], "conflict");
    assert_eq!(error["details"]["limit"], 3);
    assert_eq!(
        subscriptions(&router).await.len(),
        4,
        "three and the declared one"
    );

    // One deleted makes room for one, however many ask at once.
    let path = format!("{SUBSCRIPTIONS}/{}", id(&made[0]));
    let deleted = call(&router, "DELETE", &path, Some(ROOT), None).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let racing = (0..8).map(|_| create(&router, &body));
    let statuses: Vec<StatusCode> = futures_util::future::join_all(racing)
        .await
        .iter()
        .map(|answer| answer.status)
        .collect();
    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let conflicts = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!((created, conflicts), (1, 7), "{statuses:?}");
    assert_eq!(subscriptions(&router).await.len(), 4);
}

/// Every subscription, page by page (`limit` 100), checking each page's size and cursor.
async fn subscriptions(router: &Router) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("{SUBSCRIPTIONS}?limit=100&cursor={cursor}"),
            None => format!("{SUBSCRIPTIONS}?limit=100"),
        };
        let page = call(router, "GET", &path, Some(ROOT), None).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.json());
        let page = page.json();
        all.extend(page["subscriptions"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return all,
        }
    }
}

#[tokio::test]
async fn the_list_comes_in_pages() {
    pages(memory()).await;
}

#[tokio::test]
async fn the_postgres_list_comes_in_pages() {
    let Some(store) = postgres("pages").await else {
        return;
    };
    pages(store).await;
}

/// The declared subscription first, then the store's oldest first, `limit` at a time, each page
/// naming the next until the last (`next_cursor: null`); a cursor whose subscription was
/// deleted still goes on; a bad `limit` or `cursor` is a `400` naming it.
async fn pages(store: Arc<dyn Engine>) {
    let declared = "[[events.subscriptions]]\nurl = \"http://127.0.0.1:9/declared\"\nevent_types = [\"tools.changed\"]\nsecret_env = \"HOOKS_SECRET\"\n";
    let whsec = declared_secret().to_whsec();
    let router = app_with_env(
        &store,
        &events_table(&["1h"], declared),
        &[("HOOKS_SECRET", &whsec)],
    )
    .router()
    .unwrap();
    let mut ids = vec![subscriptions(&router).await[0]["id"].clone()];
    for _ in 0..6 {
        ids.push(json!(id(&subscribe(
            &router,
            &url_of(40),
            &["tools.changed"]
        )
        .await)));
    }
    let page = |query: String| {
        let router = router.clone();
        async move {
            let answer = call(
                &router,
                "GET",
                &format!("{SUBSCRIPTIONS}{query}"),
                Some(ROOT),
                None,
            )
            .await;
            assert_eq!(answer.status, StatusCode::OK, "{query}: {}", answer.json());
            let body = answer.json();
            let listed: Vec<Value> = body["subscriptions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|subscription| subscription["id"].clone())
                .collect();
            (listed, body["next_cursor"].clone())
        }
    };

    // Without a limit, the default page holds all seven.
    let (all, next) = page(String::new()).await;
    assert_eq!(all, ids);
    assert_eq!(next, Value::Null);

    let (first, next) = page("?limit=3".to_owned()).await;
    assert_eq!(first, ids[..3]);
    assert_eq!(next, ids[2]);
    let (second, next) = page(format!("?limit=3&cursor={}", next.as_str().unwrap())).await;
    assert_eq!(second, ids[3..6]);
    assert_eq!(next, ids[5]);
    // The last page: no cursor, even though it is full up to its end.
    let (last, next) = page(format!("?limit=1&cursor={}", next.as_str().unwrap())).await;
    assert_eq!(last, ids[6..]);
    assert_eq!(next, Value::Null);
    // A cursor from the declared ones goes on with the store's.
    let (after_declared, _) = page(format!("?limit=2&cursor={}", ids[0].as_str().unwrap())).await;
    assert_eq!(after_declared, ids[1..3]);

    // The cursor's subscription deleted: the page still starts after it.
    let cursor = ids[3].as_str().unwrap().to_owned();
    let deleted = call(
        &router,
        "DELETE",
        &format!("{SUBSCRIPTIONS}/{cursor}"),
        Some(ROOT),
        None,
    )
    .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let (rest, _) = page(format!("?limit=100&cursor={cursor}")).await;
    assert_eq!(rest, ids[4..]);

    for (query, parameter) in [
        ("?limit=0", "limit"),
        ("?limit=101", "limit"),
        ("?limit=ten", "limit"),
        ("?cursor=exec_1", "cursor"),
        ("?cursor=sub_%22%3E", "cursor"),
    ] {
        let answer = call(
            &router,
            "GET",
            &format!("{SUBSCRIPTIONS}{query}"),
            Some(ROOT),
            None,
        )
        .await;
        let error = refusal(&answer, StatusCode::BAD_REQUEST);
        assert_eq!(error["code"], "INVALID_REQUEST", "{query}");
        assert_eq!(error["details"]["parameter"], parameter, "{query}");
    }
}

/// A list of subscriptions at every bound is a few hundred kilobytes at most: a page of 100
/// with the longest URLs and descriptions.
#[tokio::test]
async fn a_page_of_the_longest_subscriptions_stays_small() {
    let store = memory();
    let router = app(&store, &events_table(&["1h"], "")).router().unwrap();
    let body = json!({
        "url": url_of(2048),
        "event_types": ["execution.finished", "health.changed", "tools.changed", "subscription.disabled"],
        "description": "d".repeat(1024),
    });
    for _ in 0..100 {
        assert_eq!(create(&router, &body).await.status, StatusCode::CREATED);
    }
    assert_eq!(create(&router, &body).await.status, StatusCode::CONFLICT);
    let default = call(&router, "GET", SUBSCRIPTIONS, Some(ROOT), None).await;
    let largest = call(
        &router,
        "GET",
        &format!("{SUBSCRIPTIONS}?limit=100"),
        Some(ROOT),
        None,
    )
    .await;
    assert_eq!(
        default.json()["subscriptions"].as_array().unwrap().len(),
        20
    );
    assert_eq!(
        largest.json()["subscriptions"].as_array().unwrap().len(),
        100
    );
    assert!(default.body.len() < 80 * 1024, "{}", default.body.len());
    assert!(largest.body.len() < 400 * 1024, "{}", largest.body.len());
}

/// With the outbox at its bound (`max_pending_deliveries`: a receiver that is down keeps its
/// deliveries pending), a new event is dropped, and health says so with a count (the output to
/// `internal` callers only) while readiness holds.
#[tokio::test]
async fn a_full_outbox_is_a_warning_in_health() {
    let store = memory();
    let router = app(
        &store,
        &events_table(&["1h"], "max_pending_deliveries = 1\n"),
    )
    .router()
    .unwrap();
    subscribe(&router, &down_url().await, &["execution.finished"]).await;
    let health = async |token: Option<&str>| {
        let answer = call(&router, "GET", "/agent/health", token, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
        answer.json()["checks"]["events"].clone()
    };
    assert_eq!(
        health(Some(ROOT)).await,
        Value::Null,
        "no check until an event is dropped"
    );
    // The first event fills the outbox; the next ones are dropped.
    for n in 0..4 {
        let answer = echo(&router, Some(PLAIN), Some(&format!("req-full-{n}"))).await;
        assert_eq!(answer.status, StatusCode::OK);
    }
    eventually("the events check warns", async || {
        health(Some(ROOT)).await["status"] == "warn"
    })
    .await;
    let check = health(Some(ROOT)).await;
    let output = check["output"].as_str().unwrap();
    assert!(output.starts_with("3 events dropped since "), "{output}");
    assert!(output.contains("bound of 1 pending"), "{output}");
    let anonymous = health(None).await;
    assert_eq!(anonymous, json!({ "status": "warn" }));
    let ready = call(&router, "GET", "/agent/health/ready", None, None).await;
    assert_eq!(ready.status, StatusCode::OK);
}
