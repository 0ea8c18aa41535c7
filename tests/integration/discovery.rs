//! `GET /.well-known/agent` (protocol.md §1, §3).

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use carmy_tests::{get, send};
use serde_json::json;

#[tokio::test]
async fn discovery_document_matches_the_protocol() {
    let router = shop::app().router().unwrap();
    let answer = get(&router, "/.well-known/agent").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("cache-control"), Some("private, max-age=60"));

    let catalog = get(&router, "/agent/tools").await;
    let tools_version = carmy_tests::sha256_hex(&catalog.body);
    let expected = format!(
        "{{\"protocol\":\"carmy/1\",\"server\":\"shop\",\"capabilities\":[\"tools\",\"streaming\",\"idempotency\",\"mcp\",\"health\",\"openapi\",\"executions\",\"console\"],\
         \"tools_url\":\"/agent/tools\",\"tools_version\":\"{tools_version}\",\"execute_url\":\"/agent/execute\",\
         \"mcp_url\":\"/mcp\",\"health_url\":\"/agent/health\",\"openapi_url\":\"/agent/openapi.json\",\"executions_url\":\"/agent/executions\",\
         \"console_url\":\"/agent/console/\"}}"
    );
    assert_eq!(std::str::from_utf8(&answer.body).unwrap(), expected);
    assert_eq!(
        answer.header("etag").unwrap(),
        format!("\"{}\"", carmy_tests::sha256_hex(&answer.body))
    );
    assert_eq!(answer.json()["tools_version"], json!(tools_version));
}

#[tokio::test]
async fn discovery_answers_conditional_and_head_requests() {
    let router = shop::app().router().unwrap();
    let first = get(&router, "/.well-known/agent").await;
    let etag = first.header("etag").unwrap().to_owned();

    let request = Request::get("/.well-known/agent")
        .header("if-none-match", &etag)
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, request).await;
    assert_eq!(answer.status, StatusCode::NOT_MODIFIED);
    assert!(answer.body.is_empty());
    assert_eq!(answer.header("etag"), Some(etag.as_str()));
    assert_eq!(answer.header("cache-control"), Some("private, max-age=60"));

    let request = Request::builder()
        .method(Method::HEAD)
        .uri("/.well-known/agent")
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, request).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.body.is_empty());
    assert_eq!(answer.header("etag"), Some(etag.as_str()));
}

#[tokio::test]
async fn server_name_comes_from_the_builder() {
    let router = carmy::App::new().name("inventory").router().unwrap();
    let answer = get(&router, "/.well-known/agent").await;
    assert_eq!(answer.json()["server"], json!("inventory"));
}
