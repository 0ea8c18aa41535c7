//! `GET /metrics` (`protocol.md` §11, opt-in): the app's metrics in the Prometheus text format,
//! or OpenMetrics when the scraper asks for it; and [`observe`], which gives every request its
//! server span and, with metrics on, its duration, around the protection gate.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tracing::Instrument;

use crate::principal::{Principal, TrustLevel};
use crate::protection;
use crate::settings::Current;
use crate::telemetry::{self, Format, Metrics, TraceParent};
use crate::wire::NO_STORE;

pub(crate) const METRICS_PATH: &str = "/metrics";

static PROMETHEUS_TEXT: HeaderValue =
    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8");
static OPENMETRICS_TEXT: HeaderValue =
    HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8");
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Who may read the metrics: callers trusted at `trust` or more; to the others the route does
/// not exist.
#[derive(Clone)]
struct Exposition {
    metrics: Arc<Metrics>,
    trust: TrustLevel,
}

pub(crate) fn router(metrics: Arc<Metrics>, trust: TrustLevel) -> Router {
    Router::new()
        .route(METRICS_PATH, get(expose))
        .with_state(Exposition { metrics, trust })
}

async fn expose(State(exposition): State<Exposition>, request: Request) -> Response {
    let caller = request
        .extensions()
        .get::<Principal>()
        .map_or(TrustLevel::Anonymous, Principal::trust);
    if caller < exposition.trust {
        return super::route_not_found().await.into_response();
    }
    let format = negotiate(request.headers());
    let content_type = match format {
        Format::Prometheus => PROMETHEUS_TEXT.clone(),
        Format::OpenMetrics => OPENMETRICS_TEXT.clone(),
    };
    (
        [
            (CONTENT_TYPE, content_type),
            (CACHE_CONTROL, NO_STORE.clone()),
        ],
        exposition.metrics.encode(format),
    )
        .into_response()
}

/// OpenMetrics when the `Accept` header rates it at least as high as plain text (as
/// Prometheus's scrape header does), else the Prometheus text format.
fn negotiate(headers: &HeaderMap) -> Format {
    let mut openmetrics = 0.0_f32;
    let mut text = 0.0_f32;
    for (media, quality) in super::accept::media_ranges(headers) {
        match media.to_ascii_lowercase().as_str() {
            "application/openmetrics-text" => openmetrics = openmetrics.max(quality),
            "text/plain" | "text/*" | "*/*" => text = text.max(quality),
            _ => {}
        }
    }
    if openmetrics > 0.0 && openmetrics >= text {
        Format::OpenMetrics
    } else {
        Format::Prometheus
    }
}

/// What the one middleware of every route needs: the metrics, when on, and the configuration
/// in force, for the gate.
#[derive(Clone)]
pub(crate) struct Observed {
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) current: Current,
}

/// The server span of every request, child of the caller's `traceparent`; with metrics on,
/// `http_server_active_requests` and `http_server_request_duration_seconds` (to the response
/// head: a stream's length is the tool's, not the server's). The route is the matched
/// template, never the raw path, so no request adds a series. Inside, the protection gate:
/// one middleware rather than two, since each boxes its future and clones the route's service
/// on every request; refusals are measured and traced too.
pub(crate) async fn observe(
    State(Observed { metrics, current }): State<Observed>,
    request: Request,
    next: Next,
) -> Response {
    let method = method_label(request.method());
    let matched = request.extensions().get::<MatchedPath>().cloned();
    let route = matched.as_ref().map(MatchedPath::as_str);
    let mut traceparents = request.headers().get_all(&TRACEPARENT).iter();
    // Several `traceparent`s are malformed, as the specification says: a new trace.
    let parent = match (traceparents.next(), traceparents.next()) {
        (Some(value), None) => value.to_str().ok().and_then(TraceParent::parse),
        _ => None,
    };
    let span = telemetry::server_span(method, route, parent.as_ref());
    let started = Instant::now();
    let active = metrics.as_deref().map(Metrics::http_request);
    let response = protection::guard(&current, request, next)
        .instrument(span.clone())
        .await;
    let status = response.status().as_u16();
    span.record("http.response.status_code", status);
    if let Some(metrics) = &metrics {
        metrics.http_answered(method, matched, status, started.elapsed());
    }
    drop(active);
    response
}

/// The semantic conventions' `http.request.method`: the known methods, `_OTHER` for the rest.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::DELETE, "DELETE"),
        (Method::CONNECT, "CONNECT"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::TRACE, "TRACE"),
        (Method::PATCH, "PATCH"),
    ];
    KNOWN
        .iter()
        .find(|(known, _)| known == method)
        .map_or("_OTHER", |(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn format_for(accept: &'static str) -> Format {
        let mut headers = HeaderMap::new();
        headers.insert(axum::http::header::ACCEPT, HeaderValue::from_static(accept));
        negotiate(&headers)
    }

    #[test]
    fn openmetrics_only_when_preferred() {
        assert_eq!(negotiate(&HeaderMap::new()), Format::Prometheus);
        assert_eq!(format_for("*/*"), Format::Prometheus);
        assert_eq!(format_for("text/plain"), Format::Prometheus);
        assert_eq!(
            format_for("application/openmetrics-text; version=1.0.0"),
            Format::OpenMetrics
        );
        // Prometheus's own scrape header.
        assert_eq!(
            format_for(
                "application/openmetrics-text;version=1.0.0;q=0.5,application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
            ),
            Format::OpenMetrics
        );
        assert_eq!(
            format_for("application/openmetrics-text;q=0.2, text/plain;q=0.9"),
            Format::Prometheus
        );
        assert_eq!(
            format_for("application/openmetrics-text;q=0"),
            Format::Prometheus
        );
    }
}
