//! carmy/1 (`protocol.md`): its routes, one module per endpoint, each behind the HTTP gate. It
//! knows nothing of tool internals: it serves the catalog's documents and drives the engine.

mod admin;
#[cfg(feature = "console")]
pub(crate) mod console;
mod document_routes;
#[cfg(feature = "events")]
mod event_routes;
mod execute;
mod execution_routes;
mod health_routes;
mod metrics_routes;
mod tool_route;

use std::sync::Arc;

use axum::Router;

use crate::http::{Admitted, GateLayer, HttpOptions, route_not_found};
use crate::principal::TrustLevel;
use crate::runtime::Runtime;
use crate::settings::Current;
use crate::settings::Reloader;
use crate::tool_error::ToolError;
use crate::wire::paths;

/// The routes of protocol.md, each behind `gate`, with JSON answers for unknown routes and
/// methods under carmy's own paths only, so that the router merges into a host's that has its
/// own fallback. Each route serves the configuration snapshot the gate attached to its request.
pub(crate) fn router(
    gate: &GateLayer,
    runtime: Arc<Runtime>,
    reloader: Arc<Reloader>,
    current: &Current,
    settings: &HttpOptions,
    #[cfg(feature = "events")] events: Arc<crate::events::Events>,
) -> Router {
    let health = health_routes::router(gate, runtime.health().clone());
    let metrics = runtime
        .metrics()
        .map(|metrics| metrics_routes::router(gate, Arc::clone(metrics), Arc::clone(current)));
    let documents = gate.endpoints(Arc::clone(current));
    let documents = Router::new()
        .route(
            paths::DISCOVERY,
            documents.get_inline(document_routes::discovery),
        )
        .route(
            paths::CATALOG,
            documents.get_inline(document_routes::catalog),
        )
        .route(
            paths::OPENAPI,
            documents.get_inline(document_routes::openapi),
        );
    let executions = execution_routes::router(
        gate,
        execution_routes::ExecutionsState {
            executions: crate::executions::Executions::new(Arc::clone(runtime.execution_store())),
            keep_alive: settings.keep_alive,
        },
    );
    let execute = gate.endpoints(execute::ExecuteState {
        runtime,
        current: Arc::clone(current),
        keep_alive: settings.keep_alive,
    });
    let execute = Router::new()
        .route(paths::EXECUTE, execute.post_inline(execute::execute))
        .route(paths::TOOL, execute.post(tool_route::call_tool));
    let router = documents
        .merge(execute)
        .merge(executions)
        .merge(health)
        .merge(admin::router(gate, reloader))
        .merge(metrics.unwrap_or_default());
    #[cfg(feature = "events")]
    let router = router.merge(event_routes::router(gate, events));
    #[cfg(feature = "console")]
    let router = router.merge(console::router(gate));
    let owned = ["/agent", "/agent/{*rest}", "/.well-known/agent/{*rest}"];
    let not_found = gate.endpoints(());
    owned.into_iter().fold(router, |router, path| {
        router.route(path, not_found.any(route_not_found))
    })
}

/// Whether the caller may use a management route: `internal`, or holding `permission`.
/// Anyone else gets the unknown route's `404`, so the route reveals nothing.
fn may_manage(request: &axum::extract::Request, permission: &str) -> bool {
    Admitted::caller(request.extensions()).is_some_and(|caller| {
        caller.trust() == TrustLevel::Internal || caller.has_permission(permission)
    })
}

/// A list's `limit` query parameter: from 1 to `max`, `default` when absent.
fn page_limit(
    parameters: &std::collections::HashMap<String, String>,
    default: usize,
    max: usize,
) -> Result<usize, ToolError> {
    let Some(limit) = parameters.get("limit") else {
        return Ok(default);
    };
    limit
        .parse::<usize>()
        .ok()
        .filter(|limit| (1..=max).contains(limit))
        .ok_or_else(|| {
            bad_parameter(
                "limit",
                &format!("limit must be a whole number from 1 to {max}"),
            )
        })
}

/// `400 INVALID_REQUEST` naming the query parameter at fault.
fn bad_parameter(parameter: &str, reason: &str) -> ToolError {
    ToolError::invalid_request(reason)
        .details(serde_json::json!({ "reason": reason, "parameter": parameter }))
}
