//! The carmy/1 HTTP adapter (`protocol.md`): routes, documents and the error envelope. It knows
//! nothing of tool internals: it serves the catalog's documents and drives the runtime.

mod documents;
pub(crate) mod error;
mod execute;
mod executions;
mod health;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{any, get, post};

use crate::runtime::Runtime;
use crate::tool_error::{Category, ToolError};
use crate::wire::codes;

pub(crate) use documents::Documents;
#[cfg(feature = "mcp")]
pub(crate) use documents::MCP_PATH;
pub(crate) use health::is_probe;

/// How the HTTP adapter is tuned; set through the [`App`](crate::App) builder.
#[derive(Clone)]
pub(crate) struct HttpSettings {
    /// How often an SSE stream sends a keep-alive comment while the tool is quiet.
    pub(crate) keep_alive: Duration,
    /// How long a request body may take to arrive, from the end of its head.
    pub(crate) body_timeout: Duration,
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            keep_alive: Duration::from_secs(15),
            body_timeout: crate::serve::MAX_BODY_TIMEOUT,
        }
    }
}

/// The routes of protocol.md, with JSON answers for unknown routes and methods under carmy's
/// own paths only, so that the router merges into a host's that has its own fallback. `mcp`:
/// whether the app also serves MCP, which discovery announces.
pub(crate) fn router(
    name: &str,
    runtime: Arc<Runtime>,
    settings: &HttpSettings,
    mcp: bool,
) -> Router {
    let documents = Arc::new(Documents::build(name, runtime.catalog(), mcp));
    let health = health::router(runtime.health().clone());
    let documents = Router::new()
        .route(documents::DISCOVERY_PATH, get(documents::discovery))
        .route(documents::CATALOG_PATH, get(documents::catalog))
        .with_state(documents);
    let executions = executions::router(executions::ExecutionsState {
        executions: runtime.executions(),
        keep_alive: settings.keep_alive,
    });
    let execute = Router::new()
        .route(documents::EXECUTE_PATH, post(execute::execute))
        .with_state(execute::ExecuteState {
            runtime,
            keep_alive: settings.keep_alive,
        });
    let mut router = documents
        .merge(execute)
        .merge(executions)
        .merge(health)
        .method_not_allowed_fallback(method_not_allowed);
    let mut owned = vec!["/agent", "/agent/{*rest}", "/.well-known/agent/{*rest}"];
    if mcp {
        owned.push("/mcp/{*rest}");
    }
    for path in owned {
        router = router.route(path, any(route_not_found));
    }
    router
}

/// The JSON 404 of carmy's paths, and of every path when carmy owns the server.
pub(crate) async fn route_not_found() -> ToolError {
    ToolError::not_found(codes::ROUTE_NOT_FOUND, "no such route").recoverable(false)
}

async fn method_not_allowed() -> ToolError {
    ToolError::validation(
        codes::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
    .recoverable(false)
}

/// Whether reading a body failed because its deadline passed (`RequestBodyDeadlineLayer`).
fn body_timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |error| error.source())
        .any(|error| error.is::<tower_http::timeout::TimeoutError>())
}

fn body_timeout() -> ToolError {
    ToolError::new(
        Category::Cancelled,
        codes::REQUEST_TIMEOUT,
        "the request body did not arrive within the body timeout",
    )
    .retryable(None)
}
