//! Event subscriptions managed through `/agent/events/subscriptions` (`protocol.md` §8):
//! created, read, listed and deleted, malformed requests refused in the JSON envelope, the
//! routes hidden from callers who may not manage events, the SSRF guard at creation, and
//! subscriptions declared in `carmy.toml`.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::webhook::SigningSecret;
use carmy_tests::{bearer, send};
use serde_json::{Value, json};

use crate::webhooks::{
    MANAGER, PLAIN, ROOT, Receiver, SHORT, SUBSCRIPTIONS, app, app_with_env, assert_signed_event,
    attempts, call, declared_secret, echo, events_table, eventually, id, read_subscription, store,
    subscribe,
};

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
    let error = carmy::config::Config::parse(declared, |_| None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("MISSING_HOOKS_SECRET"), "{error}");
    let error = carmy::config::Config::parse(declared, |name| {
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
