//! The documents over a real loopback socket.

use carmy_tests::Server;

#[tokio::test]
async fn documents_over_a_real_socket() {
    let server = Server::start(shop::app().router().unwrap()).await;
    let discovery = server.get("/.well-known/agent", &[]).await;
    assert_eq!(discovery.status, 200);
    assert_eq!(discovery.header("content-type"), Some("application/json"));
    assert_eq!(discovery.json()["protocol"], "carmy/1");

    let catalog = server.get("/agent/tools", &[]).await;
    assert_eq!(catalog.status, 200);
    assert_eq!(
        catalog.header("content-length"),
        Some(catalog.body.len().to_string().as_str())
    );
    let etag = catalog.header("etag").unwrap().to_owned();
    assert_eq!(discovery.json()["tools_version"], etag.trim_matches('"'));

    let cached = server
        .get("/agent/tools", &[("if-none-match", &etag)])
        .await;
    assert_eq!(cached.status, 304);
    assert!(cached.body.is_empty());
    assert_eq!(cached.header("etag"), Some(etag.as_str()));

    let missing = server.get("/agent/nope", &[]).await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.json()["error"]["code"], "ROUTE_NOT_FOUND");
}
