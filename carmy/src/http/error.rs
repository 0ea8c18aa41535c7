//! The JSON error envelope: how a [`ToolError`] becomes an HTTP response.

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::tool_error::{Category, ToolError, retry_after_secs};
use crate::wire::{BEARER_CHALLENGE, JSON, NO_STORE, codes};

/// The status an error is answered with: the category's, except for codes HTTP has a more
/// precise status for.
pub(crate) fn status_of(error: &ToolError) -> StatusCode {
    status_for(Some(error.category()), Some(error.code()))
}

/// The status of an answer: `200` without an error, else by category and code.
pub(crate) fn status_for(category: Option<Category>, code: Option<&str>) -> StatusCode {
    match code {
        Some(codes::PAYLOAD_TOO_LARGE) => return StatusCode::PAYLOAD_TOO_LARGE,
        Some(codes::METHOD_NOT_ALLOWED) => return StatusCode::METHOD_NOT_ALLOWED,
        Some(codes::UNAUTHENTICATED) => return StatusCode::UNAUTHORIZED,
        Some(codes::RATE_LIMITED) => return StatusCode::TOO_MANY_REQUESTS,
        Some(codes::UNSUPPORTED_VERSION) => return StatusCode::NOT_ACCEPTABLE,
        _ => {}
    }
    let Some(category) = category else {
        return StatusCode::OK;
    };
    match category {
        Category::Validation => StatusCode::BAD_REQUEST,
        Category::Permission => StatusCode::FORBIDDEN,
        Category::NotFound => StatusCode::NOT_FOUND,
        Category::Conflict => StatusCode::CONFLICT,
        Category::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Category::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Category::Capacity => StatusCode::SERVICE_UNAVAILABLE,
        Category::Timeout => StatusCode::GATEWAY_TIMEOUT,
    }
}

/// `Retry-After` for errors that carry `retry_after`.
pub(crate) fn retry_after_header(error: &ToolError) -> Option<HeaderValue> {
    error
        .retry_after()
        .map(|after| HeaderValue::from(retry_after_secs(after)))
}

#[derive(Serialize)]
struct Envelope<'a> {
    error: &'a ToolError,
}

/// `{"error": {…}}` with the error's status, for rejections before an execution exists.
impl IntoResponse for ToolError {
    fn into_response(self) -> Response {
        let body =
            serde_json::to_vec(&Envelope { error: &self }).expect("a ToolError serializes to JSON");
        let mut response = (status_of(&self), body).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, JSON.clone());
        headers.insert(CACHE_CONTROL, NO_STORE.clone());
        if let Some(retry_after) = retry_after_header(&self) {
            headers.insert(RETRY_AFTER, retry_after);
        }
        if self.code() == codes::UNAUTHENTICATED {
            headers.insert(WWW_AUTHENTICATE, BEARER_CHALLENGE.clone());
        }
        if let Some(source) = self.source() {
            tracing::warn!(code = self.code(), error = %source, "request rejected");
        }
        response
    }
}
