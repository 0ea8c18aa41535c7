//! People on the same URLs (protocol.md §10): requester detection, discovery's redirect, the
//! console's files and their headers, and the console itself in a real browser.
//!
//! The browser test runs `tests/console-browser/console.py` (Playwright for Python driving
//! Debian's chromium, axe-core from npm) against the example served as shipped. `.ci/run`
//! installs them and names the virtualenv's python in `CARMY_CONSOLE_PYTHON`; without it the
//! test says so and passes, unless `CARMY_REQUIRE_SERVICES` is set.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use carmy::protection::RateLimit;
use carmy::{Context, JsonSchema, Requester, ToolError, TrustLevel};
use carmy_tests::{Answer, Server, get, get_as, send};
use serde::{Deserialize, Serialize};
use serde_json::json;

const CHROMIUM_ACCEPT: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,\
                               image/avif,image/webp,image/apng,*/*;q=0.8,\
                               application/signed-exchange;v=b3;q=0.7";

async fn discovery(router: &axum::Router, headers: &[(&str, &str)]) -> Answer {
    let mut request = Request::get("/.well-known/agent");
    for &(name, value) in headers {
        request = request.header(name, value);
    }
    send(router, request.body(Body::empty()).unwrap()).await
}

#[tokio::test]
async fn discovery_sends_people_to_the_console_and_agents_get_the_same_bytes() {
    let router = shop::app().router().unwrap();
    let plain = discovery(&router, &[]).await;
    assert_eq!(plain.status, StatusCode::OK);
    let document = plain.json();
    assert_eq!(document["console_url"], json!("/agent/console/"));
    assert!(
        document["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("console"))
    );

    let people: &[&[(&str, &str)]] = &[
        &[("accept", CHROMIUM_ACCEPT)],
        &[("accept", "text/html")],
        &[("accept", "*/*"), ("carmy-channel", "human")],
        &[("carmy-channel", "Human")],
    ];
    for headers in people {
        let answer = discovery(&router, headers).await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{headers:?}");
        assert_eq!(answer.header("location"), Some("/agent/console/"));
        assert_eq!(answer.header("vary"), Some("Accept, Carmy-Channel"));
        assert_eq!(answer.header("cache-control"), Some("no-store"));
        assert!(answer.body.is_empty());
    }

    let agents: &[&[(&str, &str)]] = &[
        &[],
        &[("accept", "*/*")],
        &[("accept", "application/json")],
        &[("accept", "text/html, application/json")],
        &[("accept", CHROMIUM_ACCEPT), ("carmy-channel", "agent")],
        &[("accept", "text/html"), ("carmy-channel", "AGENT")],
    ];
    for headers in agents {
        let answer = discovery(&router, headers).await;
        assert_eq!(answer.status, StatusCode::OK, "{headers:?}");
        assert_eq!(answer.body, plain.body, "{headers:?}");
        assert_eq!(answer.header("etag"), plain.header("etag"));
        assert_eq!(answer.header("content-type"), Some("application/json"));
        assert_eq!(answer.header("vary"), Some("Accept, Carmy-Channel"));
    }

    // The 304 of a negotiated document varies too.
    let etag = plain.header("etag").unwrap();
    let answer = discovery(&router, &[("if-none-match", etag)]).await;
    assert_eq!(answer.status, StatusCode::NOT_MODIFIED);
    assert_eq!(answer.header("vary"), Some("Accept, Carmy-Channel"));
}

#[tokio::test]
async fn an_unknown_channel_is_refused_with_the_json_error() {
    let router = shop::app().router().unwrap();
    for value in ["robot", ""] {
        let answer = discovery(&router, &[("carmy-channel", value)]).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{value:?}");
        assert_eq!(answer.json()["error"]["code"], json!("INVALID_REQUEST"));
    }
    let twice = Request::get("/.well-known/agent")
        .header("carmy-channel", "human")
        .header("carmy-channel", "agent")
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, twice).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);

    let request = carmy_tests::execute_request(
        &json!({ "tool": "list_products" }),
        &[("carmy-channel", "robot")],
    );
    let answer = send(&router, request).await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_eq!(answer.json()["error"]["code"], json!("INVALID_REQUEST"));
}

/// Says who asked.
#[carmy::tool(effect = "none", register = false)]
async fn who_asks(ctx: Context) -> Result<String, ToolError> {
    Ok(match ctx.requester() {
        Requester::Human => "human",
        _ => "agent",
    }
    .to_owned())
}

#[tokio::test]
async fn tools_read_the_requester() {
    let router = carmy::App::new().tool(who_asks::TOOL).router().unwrap();
    let call = |headers: &'static [(&'static str, &'static str)]| {
        let router = router.clone();
        async move {
            let request = carmy_tests::execute_request(&json!({ "tool": "who_asks" }), headers);
            send(&router, request).await.json()["data"].clone()
        }
    };
    assert_eq!(call(&[]).await, json!("agent"));
    assert_eq!(call(&[("accept", "*/*")]).await, json!("agent"));
    assert_eq!(call(&[("carmy-channel", "human")]).await, json!("human"));
    assert_eq!(
        call(&[("accept", "text/html"), ("carmy-channel", "agent")]).await,
        json!("agent")
    );
    assert_eq!(call(&[("accept", CHROMIUM_ACCEPT)]).await, json!("human"));
    // The per-tool route reads it the same way.
    let request = Request::post("/agent/tools/who_asks")
        .header("content-type", "application/json")
        .header("carmy-channel", "human")
        .body(Body::from("{}"))
        .unwrap();
    assert_eq!(send(&router, request).await.json()["data"], json!("human"));

    let client = carmy::testing::Client::new(carmy::App::new().tool(who_asks::TOOL)).unwrap();
    let answer = client
        .call("who_asks", json!({}))
        .requester(Requester::Human)
        .await;
    assert_eq!(answer.body["data"], json!("human"));
}

#[tokio::test]
async fn the_console_is_served_with_its_own_policy_and_validators() {
    let router = shop::app().security_headers(true).router().unwrap();
    let page = get(&router, "/agent/console/").await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    // Its own policy, not the security headers' `default-src 'none'`, which blocks its script.
    let policy = page.header("content-security-policy").unwrap();
    assert!(policy.starts_with("default-src 'self';"), "{policy}");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(page.header("cache-control"), Some("no-cache"));
    let html = std::str::from_utf8(&page.body).unwrap();
    assert!(html.contains("<script src=\"/agent/console/console.js\" defer></script>"));

    // carmy/1's own answers keep the strict policy.
    let catalog = get(&router, "/agent/tools").await;
    assert_eq!(
        catalog.header("content-security-policy"),
        Some("default-src 'none'; frame-ancestors 'none'")
    );

    for (path, kind) in [
        (
            "/agent/console/console.js",
            "text/javascript; charset=utf-8",
        ),
        ("/agent/console/console.css", "text/css; charset=utf-8"),
        ("/agent/console/icon.svg", "image/svg+xml"),
    ] {
        let file = get(&router, path).await;
        assert_eq!(file.status, StatusCode::OK, "{path}");
        assert_eq!(file.header("content-type"), Some(kind), "{path}");
        let etag = file.header("etag").unwrap().to_owned();
        assert!(etag.starts_with("W/\""), "{etag}");
        let again = Request::get(path)
            .header("if-none-match", &etag)
            .body(Body::empty())
            .unwrap();
        let again = send(&router, again).await;
        assert_eq!(again.status, StatusCode::NOT_MODIFIED, "{path}");
        assert!(again.body.is_empty());
    }

    // Compressed for a client that accepts it, and said to vary by it.
    let zipped = Request::get("/agent/console/console.js")
        .header("accept-encoding", "gzip")
        .body(Body::empty())
        .unwrap();
    let zipped = send(&router, zipped).await;
    assert_eq!(zipped.header("content-encoding"), Some("gzip"));
    assert!(zipped.header("vary").unwrap().contains("accept-encoding"));
    let plain = get(&router, "/agent/console/console.js").await;
    assert!(zipped.body.len() * 3 < plain.body.len());

    // No other file, no other method, and the slashless path goes to the page.
    for path in [
        "/agent/console/index.html",
        "/agent/console/nope.js",
        "/agent/console/a/b",
    ] {
        let answer = get(&router, path).await;
        assert_eq!(answer.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(answer.json()["error"]["code"], json!("ROUTE_NOT_FOUND"));
    }
    let post = Request::post("/agent/console/")
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, post).await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.json()["error"]["code"], json!("METHOD_NOT_ALLOWED"));
    let slashless = get(&router, "/agent/console").await;
    assert_eq!(slashless.status, StatusCode::PERMANENT_REDIRECT);
    assert_eq!(slashless.header("location"), Some("/agent/console/"));
}

/// What the policy forbids is not in the files: no inline script or handler, no `style=""`,
/// no `data:` image, nothing fetched from another origin, no HTML built from strings.
#[test]
fn the_console_needs_nothing_its_policy_forbids() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../carmy/console");
    let page = std::fs::read_to_string(root.join("index.html")).unwrap();
    let script = std::fs::read_to_string(root.join("console.js")).unwrap();
    let styles = std::fs::read_to_string(root.join("console.css")).unwrap();
    let scripts = page.matches("<script").count();
    assert_eq!(
        scripts,
        page.matches("<script src=\"/agent/console/").count()
    );
    for forbidden in [
        " style=",
        " onclick=",
        " onload=",
        "data:",
        "http://",
        "https://",
    ] {
        assert!(!page.contains(forbidden), "index.html has {forbidden:?}");
    }
    for forbidden in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        "'style'",
        "'data:",
        "`data:",
        "fetch('http",
        "fetch(`http",
    ] {
        assert!(!script.contains(forbidden), "console.js has {forbidden:?}");
    }
    assert!(!styles.contains("url("), "console.css loads nothing");
}

#[tokio::test]
async fn the_console_spends_no_rate_limit_budget() {
    let router = shop::app()
        .rate_limit(
            TrustLevel::Anonymous,
            RateLimit {
                requests: 1,
                window: std::time::Duration::from_secs(60),
            },
        )
        .router()
        .unwrap();
    for _ in 0..5 {
        for path in ["/agent/console/", "/agent/console/console.js"] {
            assert_eq!(get(&router, path).await.status, StatusCode::OK, "{path}");
        }
    }
    assert_eq!(get(&router, "/agent/tools").await.status, StatusCode::OK);
    assert_eq!(
        get(&router, "/agent/tools").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn a_host_serves_the_page_at_its_own_address() {
    let router = shop::app()
        .merge(axum::Router::new().route("/", axum::routing::get(carmy::console::page)))
        .router()
        .unwrap();
    let root = get(&router, "/").await;
    let console = get(&router, "/agent/console/").await;
    assert_eq!(root.status, StatusCode::OK);
    assert_eq!(root.body, console.body);
    assert_eq!(
        root.header("content-security-policy"),
        console.header("content-security-policy")
    );
    let head = Request::builder()
        .method(Method::HEAD)
        .uri("/")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, head).await.status, StatusCode::OK);
}

/// How big a parcel is.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
enum Size {
    Small,
    Large,
}

/// One line of a shipment.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Line {
    /// The product.
    sku: String,
    /// Units of it.
    #[schemars(range(min = 1, max = 99))]
    quantity: u32,
}

/// Where it goes.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Address {
    city: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    zip: Option<String>,
}

/// A shipment: every shape the console's form builds.
#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Shipment {
    /// How big the parcel is.
    size: Size,
    /// Wrapped as a gift.
    gift: bool,
    /// What is in it.
    lines: Vec<Line>,
    address: Address,
    /// Said to the courier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// Signed for on delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signature: Option<bool>,
}

/// Echo a shipment back.
#[carmy::tool(effect = "none", register = false)]
async fn ship(input: Shipment) -> Result<Shipment, ToolError> {
    Ok(input)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_in_a_real_browser() {
    let Some(python) = carmy_tests::server_url("CARMY_CONSOLE_PYTHON") else {
        return;
    };
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    // The example as shipped, with its demo tokens and the console at `/`, and anonymous
    // callers allowed more than the example's 60 requests a minute: the scenario runs twice.
    let config = std::fs::read_to_string(workspace.join("examples/shop/carmy.toml")).unwrap();
    assert!(config.contains("\nanonymous = 60\n"));
    let config = config.replace("\nanonymous = 60\n", "\nanonymous = 6000\n");
    let config = carmy::config::Config::parse(&config, |_| None).unwrap();
    let router = shop::app()
        .config(config)
        .merge(axum::Router::new().route("/", axum::routing::get(carmy::console::page)))
        .router()
        .unwrap();
    let server = Server::start(router).await;
    // A second app whose one tool takes every shape of input the form builds.
    let shapes = Server::start(carmy::App::new().tool(ship::TOOL).router().unwrap()).await;
    let screenshots = workspace.join("target/console-screenshots");
    let script = workspace.join("tests/console-browser/console.py");
    let base = format!("http://{}", server.addr);
    let shapes_base = format!("http://{}", shapes.addr);
    carmy_tests::run_to_success(
        python,
        &[
            script.as_os_str(),
            base.as_ref(),
            screenshots.as_os_str(),
            shapes_base.as_ref(),
        ],
        &workspace,
    )
    .await;
    for scheme in ["light", "dark"] {
        assert!(screenshots.join(format!("console-{scheme}.png")).exists());
    }
}

/// The console's session route tells the page who it calls as and whether it may manage event
/// subscriptions, so the page never requests a management route that would answer it `404`.
#[tokio::test]
async fn the_console_session_says_who_calls_and_what_they_may_manage() {
    let config = carmy::config::Config::parse(
        &format!(
            "[events]\n\
             [[tokens]]\nid = \"reporter\"\ntrust = \"known\"\nhash = \"{}\"\n\
             [[tokens]]\nid = \"operator\"\ntrust = \"known\"\nhash = \"{}\"\n\
             permissions = [\"manage:events\"]\n\
             [[tokens]]\nid = \"assistant\"\ntrust = \"internal\"\nhash = \"{}\"\n",
            carmy::auth::hash_token("reporter-token"),
            carmy::auth::hash_token("operator-token"),
            carmy::auth::hash_token("assistant-token"),
        ),
        |_| None,
    )
    .unwrap();
    let router = shop::app().config(config).router().unwrap();
    let cases = [
        (None, json!({"id": null, "trust": "anonymous"}), false),
        (
            Some("reporter-token"),
            json!({"id": "reporter", "trust": "known"}),
            false,
        ),
        (
            Some("operator-token"),
            json!({"id": "operator", "trust": "known"}),
            true,
        ),
        (
            Some("assistant-token"),
            json!({"id": "assistant", "trust": "internal"}),
            true,
        ),
    ];
    for (token, caller, manage_events) in cases {
        let answer = get_as(&router, "/agent/console/session", token).await;
        assert_eq!(answer.status, StatusCode::OK, "{token:?}");
        assert_eq!(answer.header("cache-control"), Some("no-store"));
        assert_eq!(
            answer.json(),
            json!({"caller": caller, "manage_events": manage_events}),
            "{token:?}"
        );
    }

    // Without `[events]` nobody manages subscriptions, internal callers included.
    let config = carmy::config::Config::parse(
        &format!(
            "[[tokens]]\nid = \"assistant\"\ntrust = \"internal\"\nhash = \"{}\"\n",
            carmy::auth::hash_token("assistant-token")
        ),
        |_| None,
    )
    .unwrap();
    let router = shop::app().config(config).router().unwrap();
    let request = Request::get("/agent/console/session")
        .header("authorization", "Bearer assistant-token")
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, request).await;
    assert_eq!(answer.json()["manage_events"], json!(false));
}
