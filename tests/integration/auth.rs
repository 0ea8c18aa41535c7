//! The caller is decided on the server side: an `Authenticator` on the builder, or host
//! middleware. Bad credentials are refused, never downgraded to anonymous.

use axum::http::StatusCode;
use axum::http::request::Parts;
use carmy::auth::{Authenticator, unauthenticated};
use carmy::{Principal, ToolError, TrustLevel};
use carmy_tests::{execute, execute_request, send};
use futures_util::future::BoxFuture;
use serde_json::json;

use crate::tools::{self, Probe};

pub(crate) struct OneToken;

impl Authenticator for OneToken {
    fn authenticate<'a>(
        &'a self,
        request: &'a Parts,
    ) -> BoxFuture<'a, Result<Option<Principal>, ToolError>> {
        Box::pin(async move {
            match request.headers.get("authorization") {
                None => Ok(None),
                Some(value) if value == "Bearer good" => Ok(Some(
                    Principal::new("agent-1", TrustLevel::Known).with_permission("confirm:wipe"),
                )),
                Some(_) => Err(unauthenticated("the credentials do not verify")),
            }
        })
    }
}

#[tokio::test]
async fn the_authenticator_decides_who_calls() {
    let probe = Probe::default();
    let router = tools::app(&probe).authenticator(OneToken).router().unwrap();

    let anonymous = execute(&router, &json!({ "tool": "wipe" })).await;
    assert_eq!(anonymous.json()["error"]["code"], "CONFIRMATION_REQUIRED");

    let known = send(
        &router,
        execute_request(
            &json!({ "tool": "wipe" }),
            &[("authorization", "Bearer good")],
        ),
    )
    .await;
    assert_eq!(known.status, StatusCode::OK);
    assert_eq!(known.json()["data"]["text"], "wiped by agent-1");

    let refused = send(
        &router,
        execute_request(
            &json!({ "tool": "wipe" }),
            &[("authorization", "Bearer bad")],
        ),
    )
    .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        refused.header("www-authenticate"),
        Some("Bearer realm=\"carmy\"")
    );
    assert_eq!(refused.header("content-type"), Some("application/json"));
    let body = refused.json();
    assert!(body.get("execution_id").is_none());
    assert_eq!(body["error"]["code"], "UNAUTHENTICATED");
    assert_eq!(probe.runs(), 1);
}

#[tokio::test]
async fn host_middleware_takes_precedence_over_the_authenticator() {
    let probe = Probe::default();
    let router = tools::app(&probe)
        .authenticator(OneToken)
        .router()
        .unwrap()
        .layer(axum::middleware::from_fn(
            |mut request: axum::extract::Request, next: axum::middleware::Next| async move {
                request.extensions_mut().insert(
                    Principal::new("sso-user", TrustLevel::Internal)
                        .with_permission("confirm:wipe"),
                );
                next.run(request).await
            },
        ));
    let answer = send(
        &router,
        execute_request(
            &json!({ "tool": "wipe" }),
            &[("authorization", "Bearer bad")],
        ),
    )
    .await;
    assert_eq!(answer.json()["data"]["text"], "wiped by sso-user");
}
