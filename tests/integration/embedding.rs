//! The carmy router inside a host's router: merging works when the host has its own fallback,
//! carmy's JSON 404 covers only carmy's paths, and `carmy::Server` serves the whole.

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use carmy_tests::get as get_path;

fn host() -> axum::Router {
    let carmy = shop::app().router().unwrap();
    axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .fallback(|| async { (StatusCode::NOT_FOUND, "host: nothing here") })
        .merge(carmy)
}

#[tokio::test]
async fn a_host_router_with_its_own_fallback_merges_the_carmy_router() {
    let router = host();
    let health = get_path(&router, "/health").await;
    assert_eq!(health.status, 200);

    let foreign = get_path(&router, "/nope").await;
    assert_eq!(foreign.status, 404);
    assert_eq!(&foreign.body[..], b"host: nothing here");

    for path in ["/agent/nope", "/agent", "/.well-known/agent/x", "/mcp/nope"] {
        let answer = get_path(&router, path).await;
        assert_eq!(answer.status, 404, "{path}");
        assert_eq!(answer.json()["error"]["code"], "ROUTE_NOT_FOUND", "{path}");
    }
    let discovery = get_path(&router, "/.well-known/agent").await;
    assert_eq!(discovery.json()["protocol"], "carmy/1");
}

#[tokio::test]
async fn carmy_server_serves_a_host_router_with_the_same_limits() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        carmy::Server::new()
            .head_timeout(Duration::from_secs(1))
            .shutdown_grace(Duration::from_millis(200))
            .serve(listener, host(), async move {
                let _ = stopped.await;
            }),
    );
    let (status, body) = carmy_tests::raw(
        addr,
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "ok"));
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let closed = carmy_tests::closed_after(&mut silent, Duration::from_secs(5)).await;
    assert!(closed.is_some_and(|closed| closed < 3 * Duration::from_secs(1)));
    let _stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(3), server)
        .await
        .expect("the shutdown ends")
        .unwrap()
        .unwrap();
}
