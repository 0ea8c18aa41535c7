//! The carmy/1 HTTP adapter (`protocol.md`): routes, documents and the error envelope. It knows
//! nothing of tool internals: it serves the catalog's documents and drives the runtime.

mod documents;
mod error;

use std::sync::Arc;

use axum::Router;
use axum::routing::get;

use crate::catalog::Catalog;
use crate::tool_error::{ToolError, codes};

pub(crate) use documents::Documents;

/// The routes of protocol.md, with JSON answers for unknown routes and methods.
pub(crate) fn router(name: &str, catalog: Arc<Catalog>) -> Router {
    let documents = Arc::new(Documents::build(name, &catalog));
    Router::new()
        .route(documents::DISCOVERY_PATH, get(documents::discovery))
        .route(documents::CATALOG_PATH, get(documents::catalog))
        .with_state(documents)
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
}

async fn route_not_found() -> ToolError {
    ToolError::not_found(codes::ROUTE_NOT_FOUND, "no such route").recoverable(false)
}

async fn method_not_allowed() -> ToolError {
    ToolError::validation(
        codes::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
    .recoverable(false)
}
