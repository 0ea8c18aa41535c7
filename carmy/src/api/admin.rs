//! `POST /agent/admin/reload` (`protocol.md` §7): reloads `carmy.toml` now. Only `internal`
//! callers and holders of `manage:config` may; to anyone else the route does not exist (the
//! same `404` as an unknown route), so it reveals nothing.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::http::GateLayer;
use crate::settings::{ReloadError, Reloaded, Reloader, Trigger};
use crate::tool_error::ToolError;
use crate::wire::{JSON, NO_STORE, codes, paths};

/// The permission that opens the route to a caller below `internal`.
const MANAGE_CONFIG: &str = "manage:config";

pub(crate) fn router(gate: &GateLayer, reloader: Arc<Reloader>) -> Router {
    let admin = gate.endpoints(reloader);
    Router::new().route(
        paths::ADMIN_RELOAD,
        admin
            .post(reload)
            .fallback_service(admin.handler(wrong_method)),
    )
}

/// Another method: `405` to a caller who may reload, the unknown route's `404` to anyone else,
/// so that no method reveals the route.
async fn wrong_method(request: Request) -> Response {
    if super::may_manage(&request, MANAGE_CONFIG) {
        crate::http::method_not_allowed(request).await
    } else {
        crate::http::route_not_found(request).await
    }
}

/// `200` with `{"result": "applied" | "unchanged", "tools_changed": …}`; a file that fails is
/// `409 CONFIG_INVALID` with the error, a restart-only change `409 RESTART_REQUIRED` naming the
/// key.
async fn reload(State(reloader): State<Arc<Reloader>>, request: Request) -> Response {
    if !super::may_manage(&request, MANAGE_CONFIG) {
        return crate::http::route_not_found(request).await;
    }
    if let Err(error) = crate::http::empty_body(request.into_body(), "the reload").await {
        return error.into_response();
    }
    let reloaded = match reloader.reload(Trigger::Admin) {
        Ok(reloaded) => reloaded,
        Err(error) => return refusal(&error).into_response(),
    };
    let body = match reloaded {
        Reloaded::Applied { tools_changed } => {
            json!({ "result": "applied", "tools_changed": tools_changed })
        }
        Reloaded::Unchanged => json!({ "result": "unchanged", "tools_changed": false }),
    };
    (
        [
            (CONTENT_TYPE, JSON.clone()),
            (CACHE_CONTROL, NO_STORE.clone()),
        ],
        body.to_string(),
    )
        .into_response()
}

fn refusal(error: &ReloadError) -> ToolError {
    let code = match error {
        ReloadError::RestartRequired { .. } => codes::RESTART_REQUIRED,
        ReloadError::NoFile | ReloadError::Invalid(_) => codes::CONFIG_INVALID,
    };
    let details = match error {
        ReloadError::RestartRequired { key, .. } => json!({ "key": key }),
        ReloadError::NoFile | ReloadError::Invalid(_) => json!({ "reason": error.to_string() }),
    };
    ToolError::conflict(code, error.to_string())
        .recoverable(false)
        .details(details)
}
