//! The headers every answer carries (the protocol version, and the security headers while
//! they are on), built once into maps that an answer starts from.

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::CARMY_VERSION;

/// The protocol version every response announces.
pub(crate) static SERVED_VERSION: HeaderValue = HeaderValue::from_static("1.0");
/// The headers of `security_headers`: no sniffing, no framing, no referrer, no active content.
pub(crate) static SECURITY_HEADERS: [(HeaderName, HeaderValue); 4] = [
    (
        HeaderName::from_static("x-content-type-options"),
        HeaderValue::from_static("nosniff"),
    ),
    (
        HeaderName::from_static("x-frame-options"),
        HeaderValue::from_static("DENY"),
    ),
    (
        HeaderName::from_static("referrer-policy"),
        HeaderValue::from_static("no-referrer"),
    ),
    (
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
    ),
];

/// The gate's headers alone, for an answer that has none of its own.
pub(crate) static GATE_HEADERS: LazyLock<AnswerHeaders> = LazyLock::new(|| AnswerHeaders::new(&[]));

/// A route that set its own security header (the console's policy) keeps it.
pub(crate) fn add_security_headers(headers: &mut HeaderMap, security_headers: bool) {
    if security_headers {
        for (name, value) in &SECURITY_HEADERS {
            headers.entry(name).or_insert_with(|| value.clone());
        }
    }
}

/// The headers a route's answer starts with, built once: the gate's and then
/// the route's own. A clone is one copy of the map, where every header inserted costs a hash,
/// a probe and an entry, and a map that outgrows its first allocation is allocated again;
/// the gate leaves an answer that already has `Carmy-Version` as it is.
#[derive(Debug)]
pub(crate) struct AnswerHeaders {
    plain: HeaderMap,
    secured: HeaderMap,
}

impl AnswerHeaders {
    /// The gate's headers, then `own`: with every header the route's answer will have, a
    /// placeholder value for those it sets per answer, so that the clone has room for them.
    pub(crate) fn new(own: &[(HeaderName, HeaderValue)]) -> Self {
        let build = |security_headers| {
            let mut headers = HeaderMap::with_capacity(1 + SECURITY_HEADERS.len() + own.len());
            headers.insert(CARMY_VERSION.clone(), SERVED_VERSION.clone());
            add_security_headers(&mut headers, security_headers);
            for (name, value) in own {
                headers.insert(name.clone(), value.clone());
            }
            headers
        };
        AnswerHeaders {
            plain: build(false),
            secured: build(true),
        }
    }

    /// The headers of an answer served under a configuration with `security_headers`.
    pub(crate) fn answer(&self, security_headers: bool) -> HeaderMap {
        if security_headers {
            self.secured.clone()
        } else {
            self.plain.clone()
        }
    }
}
