//! `GET /agent/health`, `/agent/health/live` and `/agent/health/ready` (`protocol.md` §6):
//! probes that read the cached health, never a dependency, and spend no rate-limit budget.

use std::collections::BTreeMap;

use axum::Router;
use axum::extract::{RawQuery, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::context::TrustLevel;
use crate::health::{CheckStatus, Health};
use crate::http::Admitted;
use crate::http::GateLayer;
use crate::wire::paths;

static HEALTH_JSON: HeaderValue = HeaderValue::from_static("application/health+json");
static TEXT: HeaderValue = HeaderValue::from_static("text/plain; charset=utf-8");
/// A probe's answer is true only now.
static NO_STORE: HeaderValue = HeaderValue::from_static("no-store");

pub(crate) fn router(gate: &GateLayer, health: Health) -> Router {
    let health = gate.endpoints(health);
    Router::new()
        .route(paths::HEALTH, health.get(report))
        .route(paths::LIVE, health.get(live))
        .route(paths::READY, health.get(ready))
}

#[derive(Serialize)]
struct ReportBody<'a> {
    status: &'static str,
    state: &'static str,
    since: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    checks: BTreeMap<&'a str, CheckBody<'a>>,
}

#[derive(Serialize)]
struct CheckBody<'a> {
    status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    observed_ms: Option<u128>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<&'a str>,
}

/// The state machine and every component; `output` only for `internal` callers. 503 when
/// `degraded`.
async fn report(State(health): State<Health>, request: Request) -> Response {
    let internal = Admitted::caller(request.extensions())
        .is_some_and(|principal| principal.trust() == TrustLevel::Internal);
    let snapshot = health.snapshot();
    let status = snapshot.status();
    let body = ReportBody {
        status: status.as_str(),
        state: snapshot.state.as_str(),
        since: humantime::format_rfc3339_millis(snapshot.since).to_string(),
        reason: snapshot.reason.as_deref(),
        checks: snapshot
            .checks
            .iter()
            .map(|(name, result)| {
                let check = CheckBody {
                    status: result.status.as_str(),
                    observed_ms: result.observed.map(|observed| observed.as_millis()),
                    output: result.output.as_deref().filter(|_| internal),
                };
                (*name, check)
            })
            .collect(),
    };
    let code = if status == CheckStatus::Fail {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let body = serde_json::to_vec(&body).expect("the health report serializes to JSON");
    (
        code,
        [
            (CONTENT_TYPE, HEALTH_JSON.clone()),
            (CACHE_CONTROL, NO_STORE.clone()),
        ],
        body,
    )
        .into_response()
}

/// Answers while the process serves; touches nothing.
async fn live() -> Response {
    text(StatusCode::OK, "ok\n".to_owned())
}

/// 200 when the service should receive traffic; `?verbose` lists each reason as `[+]name ok`
/// or `[-]name failed`.
async fn ready(State(health): State<Health>, RawQuery(query): RawQuery) -> Response {
    let snapshot = health.snapshot();
    let ready = snapshot.ready();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let verbose = query
        .as_deref()
        .unwrap_or_default()
        .split('&')
        .any(|pair| pair.split('=').next() == Some("verbose"));
    let body = if verbose {
        snapshot
            .readiness()
            .into_iter()
            .map(|(name, ok)| {
                if ok {
                    format!("[+]{name} ok\n")
                } else {
                    format!("[-]{name} failed\n")
                }
            })
            .collect()
    } else if ready {
        "ok\n".to_owned()
    } else {
        "failed\n".to_owned()
    };
    text(code, body)
}

fn text(code: StatusCode, body: String) -> Response {
    (
        code,
        [
            (CONTENT_TYPE, TEXT.clone()),
            (CACHE_CONTROL, NO_STORE.clone()),
        ],
        body,
    )
        .into_response()
}
