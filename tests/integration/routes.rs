//! Unknown routes and methods answer with the JSON error envelope, never plain text.

use axum::http::{Method, StatusCode};
use carmy_tests::{get, send_empty};
use serde_json::json;

#[tokio::test]
async fn unknown_route_is_a_json_404() {
    let router = shop::app().router().unwrap();
    let answer = get(&router, "/agent/nope").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(
        answer.json(),
        json!({ "error": {
            "code": "ROUTE_NOT_FOUND",
            "message": "no such route",
            "category": "not_found",
            "recoverable": false,
            "retryable": false
        }})
    );
}

#[tokio::test]
async fn wrong_method_is_a_json_405() {
    let router = shop::app().router().unwrap();
    for (method, path) in [
        (Method::POST, "/agent/tools"),
        (Method::DELETE, "/.well-known/agent"),
        (Method::PUT, "/agent/tools"),
    ] {
        let answer = send_empty(&router, method.clone(), path).await;
        assert_eq!(
            answer.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert_eq!(answer.json()["error"]["code"], json!("METHOD_NOT_ALLOWED"));
        assert_eq!(answer.json()["error"]["category"], json!("validation"));
    }
}

/// Every route is wrapped in the gate where it is made: each answer, refusal, `405` and `404`
/// under carmy's paths carries the version the gate writes, whichever router the route is in.
#[tokio::test]
async fn every_route_and_method_passes_the_gate() {
    let router = shop::app().router().unwrap();
    for (method, path) in [
        (Method::GET, "/.well-known/agent"),
        (Method::GET, "/agent/tools"),
        (Method::GET, "/agent/openapi.json"),
        (Method::POST, "/agent/execute"),
        (Method::POST, "/agent/tools/create_order"),
        (Method::GET, "/agent/health"),
        (Method::GET, "/agent/health/live"),
        (Method::GET, "/agent/health/ready"),
        (Method::GET, "/agent/executions"),
        (Method::DELETE, "/agent/executions/exec_x"),
        (Method::GET, "/agent/executions/exec_x/events"),
        (Method::POST, "/agent/admin/reload"),
        (Method::GET, "/agent/admin/reload"),
        (Method::GET, "/agent/events/subscriptions"),
        (Method::PUT, "/agent/events/subscriptions"),
        (Method::GET, "/agent/console/"),
        (Method::POST, "/agent/console/"),
        (Method::POST, "/mcp"),
        (Method::PUT, "/agent/tools"),
        (Method::PUT, "/agent/execute"),
        (Method::PATCH, "/agent/health"),
        (Method::GET, "/agent/nope"),
        (Method::GET, "/.well-known/agent/nope"),
        (Method::GET, "/mcp/nope"),
    ] {
        let answer = send_empty(&router, method.clone(), path).await;
        assert_eq!(
            answer.header("carmy-version"),
            Some("1.0"),
            "{method} {path}: {}",
            answer.status
        );
    }
}

#[tokio::test]
async fn host_routes_and_layers_compose_with_the_carmy_router() {
    let router = shop::app()
        .router()
        .unwrap()
        .route("/health", axum::routing::get(|| async { "ok" }))
        .layer(axum::middleware::from_fn(
            |request: axum::extract::Request, next: axum::middleware::Next| async move {
                let mut response = next.run(request).await;
                response
                    .headers_mut()
                    .insert("x-host", "yes".parse().unwrap());
                response
            },
        ));
    let health = get(&router, "/health").await;
    assert_eq!(health.status, StatusCode::OK);
    let tools = get(&router, "/agent/tools").await;
    assert_eq!(tools.status, StatusCode::OK);
    assert_eq!(tools.header("x-host"), Some("yes"));
}
