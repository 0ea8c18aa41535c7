//! `GET /metrics` (protocol §11), read with a Prometheus text parser: off unless enabled, the
//! semantic-convention HTTP metrics and carmy's own, OpenMetrics when asked, who may read it,
//! and no series from raw input.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::TrustLevel;
use carmy::protection::RateLimit;
use carmy_tests::{Answer, execute, execute_request, get, get_as, send, send_as};
use prometheus_parse::{Sample, Scrape, Value as Reading};
use serde_json::json;

use crate::tools::{self, Probe};

/// The bucket boundaries the semantic conventions give `http.server.request.duration`.
const SEMCONV_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

fn metrics_app() -> carmy::App {
    tools::app(&Probe::default()).metrics(true)
}

/// `GET /metrics`, parsed by `prometheus-parse`.
async fn scrape(router: &axum::Router) -> Scrape {
    let answer = get(router, "/metrics").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", text(&answer));
    assert_eq!(
        answer.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    parse(&text(&answer))
}

fn parse(text: &str) -> Scrape {
    Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).expect("valid exposition")
}

fn text(answer: &Answer) -> String {
    String::from_utf8(answer.body.to_vec()).unwrap()
}

/// The one sample called `name` whose labels include `labels`.
fn sample<'a>(scrape: &'a Scrape, name: &str, labels: &[(&str, &str)]) -> &'a Sample {
    let found: Vec<&Sample> = scrape
        .samples
        .iter()
        .filter(|sample| sample.metric == name)
        .filter(|sample| {
            labels
                .iter()
                .all(|(key, value)| sample.labels.get(key).unwrap_or_default() == *value)
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {labels:?} in {:#?}", scrape.samples);
    found[0]
}

/// No execution in flight, and no request but the scrape itself.
fn assert_only_the_scrape_in_flight(scrape: &Scrape) {
    assert_eq!(
        number(sample(scrape, "carmy_executions_in_flight", &[])),
        0.0
    );
    assert_eq!(
        number(sample(scrape, "http_server_active_requests", &[])),
        1.0
    );
}

fn number(sample: &Sample) -> f64 {
    match &sample.value {
        Reading::Counter(value) | Reading::Gauge(value) | Reading::Untyped(value) => *value,
        other => panic!("not a number: {other:?}"),
    }
}

/// A histogram's count and bucket boundaries.
fn histogram(sample: &Sample) -> (f64, Vec<f64>) {
    let Reading::Histogram(buckets) = &sample.value else {
        panic!("not a histogram: {:?}", sample.value);
    };
    let count = buckets.last().expect("a +Inf bucket").count;
    let bounds = buckets
        .iter()
        .map(|bucket| bucket.less_than)
        .filter(|bound| bound.is_finite())
        .collect();
    (count, bounds)
}

#[tokio::test]
async fn metrics_are_off_unless_enabled() {
    let router = tools::app(&Probe::default()).router().unwrap();
    assert_eq!(get(&router, "/metrics").await.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn executions_replays_and_requests_are_counted_with_catalog_labels() {
    let router = metrics_app().router().unwrap();
    let echo = json!({ "tool": "echo", "arguments": { "text": "hi" }, "request_id": "metrics-1" });
    assert_eq!(execute(&router, &echo).await.status, StatusCode::OK);
    let replay = execute(&router, &echo).await;
    assert_eq!(replay.header("carmy-replayed"), Some("true"));
    execute(&router, &json!({ "tool": "refuse" })).await;
    execute(&router, &json!({ "tool": "no_such_tool" })).await;
    execute(
        &router,
        &json!({ "tool": "echo", "arguments": { "text": 1 } }),
    )
    .await;
    assert_eq!(get(&router, "/agent/tools").await.status, StatusCode::OK);

    let scrape = scrape(&router).await;
    let executions = |tool, status| {
        number(sample(
            &scrape,
            "carmy_executions_total",
            &[("tool", tool), ("status", status)],
        ))
    };
    assert_eq!(executions("echo", "completed"), 2.0);
    assert_eq!(executions("echo", "failed"), 1.0);
    assert_eq!(executions("refuse", "failed"), 1.0);
    // A tool that does not exist is no label value.
    assert_eq!(executions("", "failed"), 1.0);
    assert!(
        !scrape.samples.iter().any(|sample| sample
            .labels
            .values()
            .any(|value| value.contains("no_such"))),
        "raw input became a label"
    );
    assert_eq!(
        number(sample(&scrape, "carmy_idempotency_replays_total", &[])),
        1.0
    );
    assert_only_the_scrape_in_flight(&scrape);
    let (count, _) = histogram(sample(
        &scrape,
        "carmy_execution_duration_seconds",
        &[("tool", "echo")],
    ));
    assert_eq!(count, 3.0);

    let (count, bounds) = histogram(sample(
        &scrape,
        "http_server_request_duration_seconds",
        &[
            ("http_request_method", "POST"),
            ("http_route", "/agent/execute"),
            ("http_response_status_code", "200"),
        ],
    ));
    assert_eq!(count, 2.0, "echo twice");
    assert_eq!(bounds, SEMCONV_BUCKETS);
    let (count, _) = histogram(sample(
        &scrape,
        "http_server_request_duration_seconds",
        &[
            ("http_route", "/agent/execute"),
            ("http_response_status_code", "404"),
        ],
    ));
    assert_eq!(count, 1.0);
    let (count, _) = histogram(sample(
        &scrape,
        "http_server_request_duration_seconds",
        &[
            ("http_request_method", "GET"),
            ("http_route", "/agent/tools"),
        ],
    ));
    assert_eq!(count, 1.0);
}

/// A request given up while its tool runs (its client went away) is no longer active, and the
/// execution it cancelled no longer in flight.
#[tokio::test]
async fn a_request_given_up_is_no_longer_active() {
    let probe = Probe::default();
    let router = tools::app(&probe).metrics(true).router().unwrap();
    let slow = json!({ "tool": "slow_read", "arguments": { "millis": 10_000 } });
    let answering = tower::ServiceExt::oneshot(router.clone(), execute_request(&slow, &[]));
    tokio::select! {
        answered = answering => panic!("answered: {:?}", answered.map(|response| response.status())),
        () = probe.wait_runs(1) => {}
    }
    assert_only_the_scrape_in_flight(&scrape(&router).await);
}

#[tokio::test]
async fn rate_limited_requests_are_counted_and_scrapes_spend_no_budget() {
    let limit = RateLimit {
        requests: 1,
        window: Duration::from_secs(60),
    };
    let router = metrics_app()
        .rate_limit(TrustLevel::Anonymous, limit)
        .router()
        .unwrap();
    let call = json!({ "tool": "echo", "arguments": { "text": "hi" } });
    assert_eq!(execute(&router, &call).await.status, StatusCode::OK);
    assert_eq!(
        execute(&router, &call).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        scrape(&router).await;
    }
    let scrape = scrape(&router).await;
    assert_eq!(
        number(sample(
            &scrape,
            "carmy_rate_limited_total",
            &[("trust", "anonymous")]
        )),
        1.0
    );
    let (count, _) = histogram(sample(
        &scrape,
        "http_server_request_duration_seconds",
        &[("http_response_status_code", "429")],
    ));
    assert_eq!(count, 1.0);
}

#[tokio::test]
async fn openmetrics_when_asked() {
    let router = metrics_app().router().unwrap();
    execute(
        &router,
        &json!({ "tool": "echo", "arguments": { "text": "hi" } }),
    )
    .await;
    let request = Request::get("/metrics")
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3",
        )
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, request).await;
    assert_eq!(
        answer.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let text = text(&answer);
    assert!(text.ends_with("# EOF\n"), "{text}");
    for line in [
        "# TYPE carmy_executions counter",
        "# TYPE http_server_request_duration_seconds histogram",
        "# UNIT http_server_request_duration_seconds seconds",
        "carmy_executions_total{tool=\"echo\",status=\"completed\"} 1",
    ] {
        assert!(
            text.lines().any(|found| found == line),
            "{line} missing:\n{text}"
        );
    }
    // Still a valid exposition for a Prometheus text parser.
    let scrape = parse(&text);
    assert_eq!(
        number(sample(
            &scrape,
            "carmy_executions_total",
            &[("tool", "echo")]
        )),
        1.0
    );
}

#[tokio::test]
async fn metrics_can_be_kept_to_internal_callers() {
    let config = carmy::config::Config::parse(
        &format!(
            "[metrics]\nenabled = true\ntrust = \"internal\"\n\n[[tokens]]\nid = \"ops\"\ntrust = \"internal\"\nhash = \"{}\"\n\n[[tokens]]\nid = \"agent\"\ntrust = \"partner\"\nhash = \"{}\"\n",
            carmy::auth::hash_token("ops-token"),
            carmy::auth::hash_token("agent-token"),
        ),
        |_| None,
    )
    .unwrap();
    let router = tools::app(&Probe::default())
        .config(config)
        .router()
        .unwrap();
    let scrape_as = async |token: Option<&str>| get_as(&router, "/metrics", token).await;
    for refused in [scrape_as(None).await, scrape_as(Some("agent-token")).await] {
        assert_eq!(refused.status, StatusCode::NOT_FOUND);
        assert_eq!(refused.json()["error"]["code"], "ROUTE_NOT_FOUND");
    }
    let allowed = scrape_as(Some("ops-token")).await;
    assert_eq!(allowed.status, StatusCode::OK);
    parse(&text(&allowed));
}

#[tokio::test]
async fn the_shop_example_serves_metrics_without_a_token() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/shop/carmy.toml");
    let config =
        carmy::config::Config::parse(&std::fs::read_to_string(path).unwrap(), |_| None).unwrap();
    let router = shop::app().config(config).router().unwrap();
    // A tool hidden from the caller is, in the metrics too, a tool that does not exist.
    let hidden = execute(&router, &json!({ "tool": "sales_summary" })).await;
    assert_eq!(hidden.json()["error"]["code"], "TOOL_NOT_FOUND");
    // A call refused before it runs is still its tool's.
    let refused = execute(&router, &json!({ "tool": "create_order", "arguments": {} })).await;
    assert_eq!(refused.json()["error"]["code"], "INVALID_ARGUMENTS");
    let scrape = scrape(&router).await;
    let refused = sample(
        &scrape,
        "carmy_executions_total",
        &[("tool", "create_order"), ("status", "failed")],
    );
    assert_eq!(number(refused), 1.0);
    assert!(
        scrape
            .samples
            .iter()
            .any(|sample| sample.metric == "http_server_active_requests")
    );
    let hidden = sample(
        &scrape,
        "carmy_executions_total",
        &[("tool", ""), ("status", "failed")],
    );
    assert_eq!(number(hidden), 1.0);
    assert!(!format!("{:?}", scrape.samples).contains("sales_summary"));
}

/// A small deterministic generator: the test needs variety, not secrecy.
fn random_words(count: usize) -> Vec<String> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            format!("{state:x}")
        })
        .collect()
}

/// Every series: a metric name and its labels, without values.
fn series(scrape: &Scrape) -> BTreeSet<String> {
    scrape
        .samples
        .iter()
        .map(|sample| {
            let mut labels: Vec<String> = sample
                .labels
                .iter()
                .map(|(key, value)| format!("{key}={value}"))
                .collect();
            labels.sort();
            format!("{}{{{}}}", sample.metric, labels.join(","))
        })
        .collect()
}

#[tokio::test]
async fn random_paths_methods_and_tool_names_add_no_series() {
    let router = metrics_app().router().unwrap();
    let hit = async |word: &str| {
        for (method, path) in [
            ("GET", format!("/agent/{word}")),
            ("POST", format!("/agent/tools/{word}/x")),
            (word, "/agent/tools".to_owned()),
            ("GET", format!("/agent/tools?format={word}")),
        ] {
            let request = Request::builder()
                .method(method.to_ascii_uppercase().as_str())
                .uri(path)
                .body(Body::empty())
                .unwrap();
            send(&router, request).await;
        }
        let call = json!({ "tool": word, "arguments": { word: word } });
        execute(&router, &call).await;
    };
    hit("warmup").await;
    // The first scrape adds its own series.
    scrape(&router).await;
    let before = series(&scrape(&router).await);
    let words = random_words(100);
    for word in &words {
        hit(&format!("w{word}")).await;
    }
    let after = series(&scrape(&router).await);
    assert_eq!(before, after, "random input added series");
    let text = format!("{after:?}");
    assert!(!words.iter().any(|word| text.contains(word.as_str())));
}

/// `carmy_config_reloads_total{result}` is the app's own count of reloads by result.
#[tokio::test]
async fn config_reloads_are_counted_by_result() {
    let dir = carmy_tests::TempDir::new("metrics-reloads");
    let path = dir.0.join("carmy.toml");
    let root = format!(
        "[[tokens]]\nid = \"root\"\ntrust = \"internal\"\nhash = \"{}\"\n",
        carmy::auth::hash_token("root-token")
    );
    let write = |text: &str| {
        let staged = dir.0.join(".carmy.toml.swp");
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, &path).unwrap();
    };
    write(&root);
    let app = metrics_app().config_file(&path).unwrap();
    let reloads = app.reloads();
    let router = app.router().unwrap();
    let reload = async || {
        let request = Request::post("/agent/admin/reload")
            .header("authorization", "Bearer root-token")
            .body(Body::empty())
            .unwrap();
        send(&router, request).await.status
    };
    assert_eq!(reload().await, StatusCode::OK);
    write(&format!("security_headers = true\n{root}"));
    assert_eq!(reload().await, StatusCode::OK);
    write(&format!("no_such_key = 1\n{root}"));
    assert_eq!(reload().await, StatusCode::CONFLICT);

    let counts = reloads.counts();
    assert!(counts.applied >= 1 && counts.failed >= 1, "{counts:?}");
    let scrape = scrape(&router).await;
    for (result, count) in [
        ("applied", counts.applied),
        ("unchanged", counts.unchanged),
        ("failed", counts.failed),
    ] {
        let reading = &sample(&scrape, "carmy_config_reloads_total", &[("result", result)]).value;
        assert_eq!(*reading, Reading::Counter(count as f64), "{result}");
    }
}

/// `[metrics] trust` reloads: who may scrape changes with the file. `[metrics] enabled` sets up
/// the route once: changing it needs a restart, and the file is refused naming it.
#[tokio::test]
async fn metrics_trust_reloads_and_enabled_needs_a_restart() {
    let dir = carmy_tests::TempDir::new("metrics-trust");
    let path = dir.0.join("carmy.toml");
    let root = format!(
        "[[tokens]]\nid = \"root\"\ntrust = \"internal\"\nhash = \"{}\"\n",
        carmy::auth::hash_token("root-token")
    );
    let write = |text: &str| {
        let staged = dir.0.join(".carmy.toml.swp");
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, &path).unwrap();
    };
    write(&format!("[metrics]\nenabled = true\n\n{root}"));
    let router = tools::app(&Probe::default())
        .config_file(&path)
        .unwrap()
        .router()
        .unwrap();
    let call_as = async |method: &str, path: &str, token: Option<&str>| {
        send_as(&router, method, path, token, None).await
    };
    assert_eq!(
        call_as("GET", "/metrics", None).await.status,
        StatusCode::OK
    );

    write(&format!(
        "[metrics]\nenabled = true\ntrust = \"internal\"\n\n{root}"
    ));
    let applied = call_as("POST", "/agent/admin/reload", Some("root-token")).await;
    assert_eq!(applied.status, StatusCode::OK, "{}", applied.json());
    let hidden = call_as("GET", "/metrics", None).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    assert_eq!(hidden.json()["error"]["code"], "ROUTE_NOT_FOUND");
    let allowed = call_as("GET", "/metrics", Some("root-token")).await;
    assert_eq!(allowed.status, StatusCode::OK);

    write(&format!(
        "[metrics]\nenabled = false\ntrust = \"internal\"\n\n{root}"
    ));
    let refused = call_as("POST", "/agent/admin/reload", Some("root-token")).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(refused.json()["error"]["code"], "RESTART_REQUIRED");
    assert_eq!(refused.json()["error"]["details"]["key"], "metrics.enabled");
}
