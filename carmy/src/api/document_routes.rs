//! `GET /.well-known/agent`, `GET /agent/tools` and `GET /agent/openapi.json` (`protocol.md`
//! §1–3, §10, §11): the documents of the caller's trust level, served from memory with
//! conditional GET; discovery is negotiated when the console is served.

use axum::body::Body;
use axum::extract::{Query, Request};
use axum::http::header::{CACHE_CONTROL, IF_NONE_MATCH, LOCATION, VARY};
use axum::http::{Extensions, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::catalog::Provider;
use crate::context::Requester;
use crate::documents::{Document, Documents, LevelDocuments};
use crate::http::Present;
use crate::http::requester::{VARY_REQUESTER, requester};
use crate::http::{Admitted, settings_of};
use crate::principal::{Principal, TrustLevel};
use crate::settings::Current;
use crate::tool_error::ToolError;
use crate::wire::{NO_STORE, paths};

#[derive(Deserialize)]
struct CatalogQuery {
    format: Option<String>,
}

/// The documents the caller of `request` sees (anonymous when nobody attached a caller).
fn for_caller<'a>(documents: &'a Documents, request: &Extensions) -> &'a LevelDocuments {
    documents.for_trust(Admitted::caller(request).map_or(TrustLevel::Anonymous, Principal::trust))
}

/// `200` with `document`, or `304` when the client's `If-None-Match` matches; `secured`:
/// whether the configuration the request was admitted under has security headers.
fn respond(document: &Document, request: &HeaderMap, secured: bool) -> Response {
    let not_modified = not_modified(request, document.etag());
    let mut response = if not_modified {
        not_modified_response()
    } else {
        Response::new(Body::from(document.body().clone()))
    };
    *response.headers_mut() = document.headers(not_modified, secured);
    response
}

/// `200` with `body`, or `304` with no body when the client's `If-None-Match` matches `etag`;
/// both carry the validator and `cache_control`.
#[cfg(feature = "console")]
pub(super) fn conditional(
    request: &HeaderMap,
    etag: &HeaderValue,
    cache_control: &HeaderValue,
    content_type: &HeaderValue,
    body: bytes::Bytes,
) -> Response {
    let not_modified = not_modified(request, etag);
    let mut response = if not_modified {
        not_modified_response()
    } else {
        Response::new(Body::from(body))
    };
    let headers = response.headers_mut();
    headers.reserve(crate::http::RESPONSE_HEADERS);
    headers.insert(axum::http::header::ETAG, etag.clone());
    headers.insert(CACHE_CONTROL, cache_control.clone());
    if !not_modified {
        headers.insert(axum::http::header::CONTENT_TYPE, content_type.clone());
    }
    response
}

/// Whether the client's `If-None-Match` matches `etag`.
fn not_modified(request: &HeaderMap, etag: &HeaderValue) -> bool {
    request
        .get_all(IF_NONE_MATCH)
        .iter()
        .any(|value| if_none_match_matches(value, etag))
}

fn not_modified_response() -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NOT_MODIFIED;
    response
}

/// The discovery document; with the console served, a person is sent to it instead
/// (`protocol.md` §10), and both answers say they vary by who asks.
pub(crate) async fn discovery(current: Current, request: Request) -> Response {
    let settings = settings_of(request.extensions(), &current);
    let (documents, secured) = (&settings.documents, settings.protection.security_headers);
    if !documents.negotiated() {
        let discovery = for_caller(documents, request.extensions()).discovery();
        return respond(discovery, request.headers(), secured);
    }
    let present = Present::in_request(request.extensions(), request.headers());
    let mut response = match requester(request.headers(), present) {
        Ok(Requester::Human) => (
            StatusCode::SEE_OTHER,
            [
                (LOCATION, HeaderValue::from_static(paths::CONSOLE)),
                (CACHE_CONTROL, NO_STORE.clone()),
            ],
        )
            .into_response(),
        Ok(_) => respond(
            for_caller(documents, request.extensions()).discovery(),
            request.headers(),
            secured,
        ),
        Err(error) => error.into_response(),
    };
    response.headers_mut().insert(VARY, VARY_REQUESTER.clone());
    response
}

/// The catalog, or with `?format=` the provider definitions; an unknown format is a `400`.
pub(crate) async fn catalog(current: Current, request: Request) -> Response {
    let settings = settings_of(request.extensions(), &current);
    let level = for_caller(&settings.documents, request.extensions());
    let document = match requested_format(request.uri()) {
        Ok(None) => level.catalog(),
        Ok(Some(provider)) => level.provider(provider),
        Err(error) => return error.into_response(),
    };
    respond(
        document,
        request.headers(),
        settings.protection.security_headers,
    )
}

/// The OpenAPI document the caller's trust level sees, served like the catalog.
pub(crate) async fn openapi(current: Current, request: Request) -> Response {
    let settings = settings_of(request.extensions(), &current);
    let document = for_caller(&settings.documents, request.extensions()).openapi();
    respond(
        document,
        request.headers(),
        settings.protection.security_headers,
    )
}

/// The provider named by `?format=`, if any.
fn requested_format(uri: &axum::http::Uri) -> Result<Option<Provider>, ToolError> {
    let unsupported = || {
        ToolError::invalid_request("`format` must be one of the supported provider formats")
            .details(serde_json::json!({
                "reason": "`format` must be one of the supported provider formats",
                "supported": Provider::ALL.map(Provider::as_str),
            }))
    };
    let Query(query) = Query::<CatalogQuery>::try_from_uri(uri).map_err(|_| unsupported())?;
    query
        .format
        .map(|name| Provider::from_name(&name).ok_or_else(unsupported))
        .transpose()
}

/// `If-None-Match` uses weak comparison (RFC 9110 §13.1.2): `W/` prefixes are ignored, `*`
/// matches any current representation, and the value may be a comma-separated list.
fn if_none_match_matches(header: &HeaderValue, etag: &HeaderValue) -> bool {
    // The usual form: the one tag this client was sent, as it was sent.
    if header == etag {
        return true;
    }
    let Ok(header) = header.to_str() else {
        return false;
    };
    fn opaque(tag: &[u8]) -> &[u8] {
        tag.strip_prefix(b"W/").unwrap_or(tag)
    }
    let etag = opaque(etag.as_bytes());
    header
        .split(',')
        .map(str::trim)
        .any(|candidate| candidate == "*" || opaque(candidate.as_bytes()) == etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_forms() {
        let etag = HeaderValue::from_static("\"abc\"");
        let matches =
            |value: &'static str| if_none_match_matches(&HeaderValue::from_static(value), &etag);
        assert!(matches("\"abc\""));
        assert!(matches("W/\"abc\""));
        assert!(matches("*"));
        assert!(matches("\"x\", \"abc\""));
        assert!(matches("\"x\",W/\"abc\""));
        assert!(!matches("\"abd\""));
        assert!(!matches("abc"));
        assert!(!matches("\"x\", \"y\""));
        assert!(!matches(""));
        let weak = HeaderValue::from_static("W/\"abc\"");
        assert!(if_none_match_matches(
            &HeaderValue::from_static("\"abc\""),
            &weak
        ));
        assert!(if_none_match_matches(
            &HeaderValue::from_static("W/\"abc\""),
            &weak
        ));
    }
}
