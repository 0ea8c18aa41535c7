//! The Prometheus metrics of one app (`protocol.md` §11), named after the OpenTelemetry
//! semantic conventions. Label values are `'static` names from the catalog and the protocol, or
//! axum's matched route, never raw input, so no request can add a series.
//!
//! Adding a metric: a field here, one `register` line in [`Metrics::new`], and a method that
//! records it.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{PoisonError, RwLock};
use std::time::Duration;

use axum::extract::MatchedPath;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::{Family, MetricConstructor};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::principal::TrustLevel;
use crate::reload::Reloads;
use crate::status::ExecutionStatus;

/// The bucket boundaries (seconds) the semantic conventions advise for
/// `http.server.request.duration`.
const HTTP_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];
/// Executions: the same, on to the longest tool deadlines.
const EXECUTION_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0, 60.0,
];

/// The exposition formats `/metrics` speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// The Prometheus text format, version 0.0.4.
    Prometheus,
    /// OpenMetrics 1.0 text.
    OpenMetrics,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    http_request_method: &'static str,
    /// The route template that matched (`/agent/tools`), or empty: no route matched.
    http_route: Route,
    http_response_status_code: u16,
}

/// A matched route template as a label value: axum's own shared string, so labelling a request
/// allocates nothing.
#[derive(Debug, Clone)]
struct Route(Option<MatchedPath>);

impl Route {
    fn as_str(&self) -> &str {
        self.0.as_ref().map_or("", MatchedPath::as_str)
    }
}

impl std::hash::Hash for Route {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq for Route {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Route {}

impl EncodeLabelValue for Route {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
        EncodeLabelValue::encode(&self.as_str(), encoder)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExecutionLabels {
    /// Empty when the call named no tool of the catalog.
    tool: &'static str,
    status: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TrustLabels {
    trust: &'static str,
}

/// A family whose series are found again by a fast hash of a key of their own, `K`.
/// prometheus-client's `Family` hashes a lookup's labels with SipHash, about 500 instructions
/// for a route's; here a label set's first use goes through the family (so the exposition is
/// the family's), and later ones find the same series (a shared handle) by foldhash of `K`:
/// the labels themselves, or for labels of `'static` names only, their [`static_identity`].
/// Label values are never raw input, so the map is as bounded as the family.
struct Series<K, L, M, C = fn() -> M> {
    family: Family<L, M, C>,
    known: RwLock<HashMap<K, M, foldhash::fast::RandomState>>,
}

/// Where a `'static` text lives and how long it is.
type StaticIdentity = (usize, usize);

/// A `'static` text's [`StaticIdentity`]: hashed and compared without reading the
/// text. Such a text is never freed, so two that differ never share it; two alike may not,
/// and then find the same series through the family.
fn static_identity(text: &'static str) -> StaticIdentity {
    (text.as_ptr() as usize, text.len())
}

impl<K, L, M, C> Series<K, L, M, C>
where
    K: Clone + Hash + Eq,
    L: Clone + Hash + Eq,
    M: Clone,
    C: MetricConstructor<M>,
{
    fn new(family: Family<L, M, C>) -> Self {
        Series {
            family,
            known: RwLock::default(),
        }
    }

    /// Records on the series of `labels`, found by `key`.
    fn record(&self, key: &K, labels: &L, record: impl FnOnce(&M)) {
        if let Some(series) = self
            .known
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(key)
        {
            return record(series);
        }
        let series = self.family.get_or_create(labels).clone();
        record(&series);
        self.known
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key.clone(), series);
    }
}

/// The metrics of one app and the registry that exposes them.
pub(crate) struct Metrics {
    registry: Registry,
    /// By the labels' text: a nested router makes its matched route's text per request.
    http_duration: Series<HttpLabels, HttpLabels, Histogram>,
    http_active: Gauge,
    /// By the tool's and the status's [`static_identity`].
    executions: Series<(StaticIdentity, StaticIdentity), ExecutionLabels, Counter>,
    /// By the tool's [`static_identity`].
    execution_duration: Series<StaticIdentity, ToolLabels, Histogram>,
    in_flight: Gauge,
    replays: Counter,
    rate_limited: Family<TrustLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// `reloads`: the configuration reloads, counted where they happen.
    pub(crate) fn new(reloads: &Reloads) -> Self {
        let metrics = Metrics {
            registry: Registry::default(),
            http_duration: Series::new(Family::new_with_constructor(|| {
                Histogram::new(HTTP_BUCKETS)
            })),
            http_active: Gauge::default(),
            executions: Series::new(Family::new_with_constructor(Counter::default)),
            execution_duration: Series::new(Family::new_with_constructor(|| {
                Histogram::new(EXECUTION_BUCKETS)
            })),
            in_flight: Gauge::default(),
            replays: Counter::default(),
            rate_limited: Family::default(),
        };
        let mut registry = metrics.registry;
        registry.register_with_unit(
            "http_server_request_duration",
            "Duration of HTTP server requests",
            Unit::Seconds,
            metrics.http_duration.family.clone(),
        );
        registry.register(
            "http_server_active_requests",
            "Number of active HTTP server requests",
            metrics.http_active.clone(),
        );
        registry.register(
            "carmy_executions",
            "Tool executions, by tool and final status",
            metrics.executions.family.clone(),
        );
        registry.register_with_unit(
            "carmy_execution_duration",
            "Duration of tool executions, replays and refusals included",
            Unit::Seconds,
            metrics.execution_duration.family.clone(),
        );
        registry.register(
            "carmy_executions_in_flight",
            "Tools running now",
            metrics.in_flight.clone(),
        );
        registry.register(
            "carmy_idempotency_replays",
            "Calls answered with the recorded response of an earlier call",
            metrics.replays.clone(),
        );
        registry.register(
            "carmy_rate_limited",
            "Requests refused by a rate limit, by the caller's trust level",
            metrics.rate_limited.clone(),
        );
        registry.register(
            "carmy_config_reloads",
            "Configuration reloads, by result",
            reloads.family(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The registry in `format`.
    pub(crate) fn encode(&self, format: Format) -> String {
        let mut text = String::new();
        let encoded = match format {
            Format::Prometheus => {
                prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
            }
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut text, &self.registry)
            }
        };
        encoded.expect("writing to a String cannot fail");
        text
    }

    /// An HTTP request began: it counts as active until [`Metrics::http_request_ended`].
    pub(crate) fn http_request_began(&self) {
        self.http_active.inc();
    }

    /// An HTTP request was answered, or given up when its client went away.
    pub(crate) fn http_request_ended(&self) {
        self.http_active.dec();
    }

    /// An HTTP request was answered. `method`: a known method's name or `_OTHER`; `route`: the
    /// template that matched, if any.
    pub(crate) fn http_answered(
        &self,
        method: &'static str,
        route: Option<MatchedPath>,
        status: u16,
        elapsed: Duration,
    ) {
        let labels = HttpLabels {
            http_request_method: method,
            http_route: Route(route),
            http_response_status_code: status,
        };
        self.http_duration.record(&labels, &labels, |series| {
            series.observe(elapsed.as_secs_f64());
        });
    }

    /// A tool started running; it counts as in flight until the guard is dropped.
    pub(crate) fn execution_running(&self) -> Active<'_> {
        self.in_flight.inc();
        Active(&self.in_flight)
    }

    /// A call was answered. `tool`: the catalog's name, or `None` for a tool that does not
    /// exist.
    pub(crate) fn execution_answered(
        &self,
        tool: Option<&'static str>,
        status: ExecutionStatus,
        replayed: bool,
        elapsed: Duration,
    ) {
        let tool = tool.unwrap_or_default();
        let status = status.as_str();
        let labels = ExecutionLabels { tool, status };
        let key = (static_identity(tool), static_identity(status));
        self.executions.record(&key, &labels, |series| {
            series.inc();
        });
        let labels = ToolLabels { tool };
        self.execution_duration
            .record(&static_identity(tool), &labels, |series| {
                series.observe(elapsed.as_secs_f64());
            });
        if replayed {
            self.replays.inc();
        }
    }

    /// A request was refused by the rate limit of `trust`.
    pub(crate) fn rate_limited(&self, trust: TrustLevel) {
        self.rate_limited
            .get_or_create(&TrustLabels {
                trust: trust.as_str(),
            })
            .inc();
    }
}

/// Decrements a gauge when dropped.
#[derive(Debug)]
pub(crate) struct Active<'a>(&'a Gauge);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A router nested under a prefix as a service (as one with a fallback of its own, like
    /// carmy's, is) makes its matched route's text anew for each request: the requests of one
    /// route are one series, and one entry of the lookup map.
    #[tokio::test]
    async fn a_nested_route_is_one_series_whatever_its_text_s_address() {
        use axum::body::Body;
        use axum::http::Request;
        use std::sync::Arc;
        use tower::ServiceExt;

        let metrics = Arc::new(Metrics::new(&Reloads::default()));
        let recorder = Arc::clone(&metrics);
        let answer = move |route: MatchedPath| async move {
            recorder.http_answered("GET", Some(route), 200, Duration::from_millis(1));
        };
        let inner = axum::Router::new().route("/tools", axum::routing::get(answer));
        let router = axum::Router::new().nest_service("/agent", inner);
        for _ in 0..3 {
            let request = Request::get("/agent/tools").body(Body::empty()).unwrap();
            router.clone().oneshot(request).await.unwrap();
        }
        assert_eq!(metrics.http_duration.known.read().unwrap().len(), 1);
        let text = metrics.encode(Format::Prometheus);
        assert!(
            text.contains(
                "http_server_request_duration_seconds_count{http_request_method=\"GET\",\
                 http_route=\"/agent/tools\",http_response_status_code=\"200\"} 3"
            ),
            "{text}"
        );
    }

    /// A tool named by two texts alike, at two addresses (two identities), counts in one
    /// series: the exposition is the family's, by the labels' text.
    #[test]
    fn equal_labels_at_two_addresses_count_in_one_series() {
        let metrics = Metrics::new(&Reloads::default());
        let elsewhere: &'static str = String::from("echo").leak();
        for tool in ["echo", elsewhere, "echo"] {
            let elapsed = Duration::from_millis(1);
            metrics.execution_answered(Some(tool), ExecutionStatus::Completed, false, elapsed);
        }
        assert_eq!(metrics.executions.known.read().unwrap().len(), 2);
        let text = metrics.encode(Format::Prometheus);
        let series: Vec<&str> = text
            .lines()
            .filter(|line| line.starts_with("carmy_executions_total{"))
            .collect();
        assert_eq!(
            series,
            ["carmy_executions_total{tool=\"echo\",status=\"completed\"} 3"]
        );
        assert!(
            text.contains("carmy_execution_duration_seconds_count{tool=\"echo\"} 3"),
            "{text}"
        );
    }
}
