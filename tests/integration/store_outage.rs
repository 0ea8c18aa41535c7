//! A shared store that cannot be reached: at start-up it is an error; later, every call with a
//! `request_id` answers a retryable `503 IDEMPOTENCY_UNAVAILABLE` and the tool does not run
//! (never a silent fallback that could run a write twice).

use std::net::{SocketAddr, ToSocketAddrs};

use axum::http::StatusCode;
use carmy_tests::{Proxy, execute, run_id, server_url};
use serde_json::json;

use crate::tools::{self, Probe};

/// The `host:port` of a `scheme://[user@]host:port/…` URL, and the URL with another one.
pub(crate) fn split_authority(url: &str) -> (SocketAddr, impl Fn(SocketAddr) -> String) {
    let (scheme, rest) = url.split_once("://").expect("a URL with an authority");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, host_port)) => (format!("{user}@"), host_port),
        None => (String::new(), authority),
    };
    let target = host_port
        .to_socket_addrs()
        .expect("host:port resolves")
        .next()
        .expect("an address");
    let (scheme, tail) = (scheme.to_owned(), tail.to_owned());
    (target, move |addr| format!("{scheme}://{user}{addr}{tail}"))
}

async fn an_outage_after_start_up_is_503(url: &str) {
    let (target, with_authority) = split_authority(url);
    let proxy = Proxy::start(target).await;
    let store = carmy::idempotency::connect(&with_authority(proxy.addr))
        .await
        .expect("the store is reachable at start-up");
    let probe = Probe::default();
    let router = tools::app(&probe)
        .idempotency_store(store)
        .router()
        .unwrap();
    let call = |request_id: &str| json!({ "tool": "count", "arguments": { "text": "a" }, "request_id": format!("{}-{request_id}", run_id()) });
    assert_eq!(
        execute(&router, &call("before")).await.status,
        StatusCode::OK
    );

    proxy.close().await;
    for request_id in ["before", "during"] {
        let refused = execute(&router, &call(request_id)).await;
        assert_eq!(
            refused.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{request_id}"
        );
        assert_eq!(refused.json()["error"]["code"], "IDEMPOTENCY_UNAVAILABLE");
        assert_eq!(refused.json()["error"]["retryable"], true);
        assert!(refused.header("retry-after").is_some());
    }
    assert_eq!(probe.runs(), 1, "no call ran without a record");
}

#[tokio::test]
async fn postgres_going_away_answers_503_idempotency_unavailable() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    an_outage_after_start_up_is_503(&url).await;
}

#[tokio::test]
async fn redis_going_away_answers_503_idempotency_unavailable() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    an_outage_after_start_up_is_503(&url).await;
}

#[tokio::test]
async fn an_unreachable_store_is_a_start_up_error() {
    // Nothing listens on a port we bound and let go.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    for url in [
        format!("postgres://postgres@{closed}/test"),
        format!("redis://{closed}"),
    ] {
        let error = carmy::idempotency::connect(&url)
            .await
            .err()
            .unwrap_or_else(|| panic!("{url} connected"));
        assert!(!error.to_string().is_empty());
    }
}

#[tokio::test]
async fn bad_store_urls_are_clear_errors() {
    for (url, expected) in [
        (
            "mysql://127.0.0.1/db",
            "unknown idempotency store scheme `mysql`",
        ),
        ("file:", "needs a path"),
        (
            "127.0.0.1:6379",
            "unknown idempotency store scheme `127.0.0.1`",
        ),
    ] {
        let error = carmy::idempotency::connect(url).await.err().expect(url);
        assert!(error.to_string().contains(expected), "{url}: {error}");
    }
}
