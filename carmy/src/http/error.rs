//! The JSON error envelope: how a [`ToolError`] becomes an HTTP response.

use std::sync::LazyLock;

use axum::body::Body;
use axum::http::header::{
    CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE,
};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::tool_error::{ToolError, retry_after_secs};
pub(crate) use crate::tool_error::{status_for, status_of};
use crate::wire::headers::AnswerHeaders;
use crate::wire::{BEARER_CHALLENGE, JSON, NO_STORE, codes};

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

/// The headers of an envelope, the gate's first, made once; `Content-Length` is each answer's.
static ENVELOPE: LazyLock<AnswerHeaders> = LazyLock::new(|| {
    AnswerHeaders::new(&[
        (CONTENT_TYPE, JSON.clone()),
        (CACHE_CONTROL, NO_STORE.clone()),
        (CONTENT_LENGTH, HeaderValue::from_static("0")),
    ])
});

/// `{"error": {…}}` with the error's status, for rejections before an execution exists.
impl IntoResponse for ToolError {
    fn into_response(self) -> Response {
        let mut headers = HeaderMap::with_capacity(super::RESPONSE_HEADERS);
        headers.insert(CONTENT_TYPE, JSON.clone());
        headers.insert(CACHE_CONTROL, NO_STORE.clone());
        envelope(&self, headers, false)
    }
}

/// The envelope of `error` as a route behind the gate answers it, the gate's headers (those of
/// a configuration with `secured` security headers) copied from a map made once rather than
/// added one by one.
pub(crate) fn answer(error: &ToolError, secured: bool) -> Response {
    envelope(error, ENVELOPE.answer(secured), true)
}

/// The envelope of `error`, its headers `headers` and those that depend on the error;
/// `length`: `headers` hold a `Content-Length` to set (else hyper writes the body's).
fn envelope(error: &ToolError, mut headers: HeaderMap, length: bool) -> Response {
    let body = serde_json::to_vec(&Envelope { error }).expect("a ToolError serializes to JSON");
    if length {
        headers.insert(CONTENT_LENGTH, super::content_length(body.len()));
    }
    if let Some(retry_after) = retry_after_header(error) {
        headers.insert(RETRY_AFTER, retry_after);
    }
    if error.code() == codes::UNAUTHENTICATED {
        headers.insert(WWW_AUTHENTICATE, BEARER_CHALLENGE.clone());
    }
    if let Some(source) = error.source() {
        tracing::warn!(code = error.code(), error = %source, "request rejected");
    }
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status_of(error);
    *response.headers_mut() = headers;
    response
}
