//! `GET /metrics` (`protocol.md` §11, opt-in): the app's metrics in the Prometheus text format,
//! or OpenMetrics when the scraper asks for it.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};

use crate::http::GateLayer;
use crate::http::{Admitted, settings_of};
use crate::principal::{Principal, TrustLevel};
use crate::settings::Current;
use crate::telemetry::{Format, Metrics};
use crate::wire::{NO_STORE, paths};

static PROMETHEUS_TEXT: HeaderValue =
    HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8");
static OPENMETRICS_TEXT: HeaderValue =
    HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8");

/// The metrics, and the configuration whose snapshot says who may read them: callers trusted
/// at its `metrics_trust` or more; to the others the route does not exist.
#[derive(Clone)]
struct Exposition {
    metrics: Arc<Metrics>,
    current: Current,
}

pub(crate) fn router(gate: &GateLayer, metrics: Arc<Metrics>, current: Current) -> Router {
    let exposition = gate.endpoints(Exposition { metrics, current });
    Router::new().route(paths::METRICS, exposition.get(expose))
}

async fn expose(State(exposition): State<Exposition>, request: Request) -> Response {
    let extensions = request.extensions();
    let caller = Admitted::caller(extensions).map_or(TrustLevel::Anonymous, Principal::trust);
    if caller < settings_of(extensions, &exposition.current).metrics_trust {
        return crate::http::route_not_found(request).await;
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
    for (media, quality) in crate::http::accept::media_ranges(headers) {
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
