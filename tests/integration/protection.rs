//! Trust and protection: who may see and call which tool, how much each caller may send, and
//! which protocol versions are served — through the router and over real sockets.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use carmy::auth::{TokenAuthenticator, hash_token};
use carmy::protection::{MemoryRateLimiter, RateLimit};
use carmy::{Principal, ToolError, TrustLevel};
use carmy_tests::{Answer, Serving, bearer, execute_request, request, send, send_to, server_url};
use serde_json::{Value, json};

use crate::tools::{self, Probe, Text};

const KNOWN_TOKEN: &str = "known-token-0123456789";
const INTERNAL_TOKEN: &str = "internal-token-0123456789";

/// The ledger: only callers trusted at `known` or above may see it.
#[carmy::tool(effect = "read", idempotent = true, access = "known", register = false)]
async fn ledger(input: Text) -> Result<Text, ToolError> {
    Ok(Text {
        text: format!("ledger: {}", input.text),
    })
}

fn tokens() -> TokenAuthenticator {
    TokenAuthenticator::new()
        .token(
            &hash_token(KNOWN_TOKEN),
            Principal::new("reporting", TrustLevel::Known),
        )
        .unwrap()
        .token(
            &hash_token(INTERNAL_TOKEN),
            Principal::new("assistant", TrustLevel::Internal).with_permission("confirm:wipe"),
        )
        .unwrap()
}

fn app(probe: &Probe) -> carmy::App {
    tools::app(probe).tool(ledger::TOOL).authenticator(tokens())
}

fn get_request(path: &str, headers: &[(&str, &str)]) -> Request<Body> {
    request("GET", path, headers)
}

fn tool_names(catalog: &Value) -> Vec<&str> {
    catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect()
}

fn from_peer(mut request: Request<Body>, peer: [u8; 4]) -> Request<Body> {
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((peer, 4000))));
    request
}

#[tokio::test]
async fn each_trust_level_sees_its_own_catalog_and_etag() {
    let router = app(&Probe::default()).router().unwrap();
    let auth = bearer(KNOWN_TOKEN);

    let anonymous = send(&router, get_request("/agent/tools", &[])).await;
    let known = send(
        &router,
        get_request("/agent/tools", &[("authorization", auth.as_str())]),
    )
    .await;
    assert_eq!(anonymous.status, StatusCode::OK);
    assert_eq!(known.status, StatusCode::OK);
    assert!(!tool_names(&anonymous.json()).contains(&"ledger"));
    assert!(tool_names(&known.json()).contains(&"ledger"));
    assert_eq!(
        tool_names(&known.json()).len(),
        tool_names(&anonymous.json()).len() + 1
    );
    let anonymous_etag = anonymous.header("etag").unwrap();
    let known_etag = known.header("etag").unwrap();
    assert_ne!(anonymous_etag, known_etag);
    assert_eq!(
        anonymous_etag,
        format!("\"{}\"", carmy_tests::sha256_hex(&anonymous.body))
    );

    // Each level's ETag revalidates its own catalog only.
    let not_modified = send(
        &router,
        get_request(
            "/agent/tools",
            &[
                ("authorization", auth.as_str()),
                ("if-none-match", known_etag),
            ],
        ),
    )
    .await;
    assert_eq!(not_modified.status, StatusCode::NOT_MODIFIED);
    let changed = send(
        &router,
        get_request("/agent/tools", &[("if-none-match", known_etag)]),
    )
    .await;
    assert_eq!(changed.status, StatusCode::OK);

    // Discovery announces the version of the catalog the caller sees.
    let discovery = send(&router, get_request("/.well-known/agent", &[]))
        .await
        .json();
    let known_discovery = send(
        &router,
        get_request("/.well-known/agent", &[("authorization", auth.as_str())]),
    )
    .await
    .json();
    assert_eq!(discovery["tools_version"], anonymous_etag.trim_matches('"'));
    assert_eq!(
        known_discovery["tools_version"],
        known_etag.trim_matches('"')
    );
}

/// The answer with what differs between two tool names taken out.
fn normalized(answer: &Answer, tool: &str) -> (StatusCode, String) {
    let mut body = answer.json();
    body["execution_id"] = Value::Null;
    let text = body.to_string().replace(tool, "TOOL");
    (answer.status, text)
}

#[tokio::test]
async fn a_hidden_tool_answers_exactly_like_a_missing_one() {
    let probe = Probe::default();
    let router = app(&probe).router().unwrap();
    let call = |tool: &str| json!({ "tool": tool, "arguments": { "text": "x" } });

    let hidden = send(&router, execute_request(&call("ledger"), &[])).await;
    let missing = send(&router, execute_request(&call("ledgex"), &[])).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    assert_eq!(hidden.json()["error"]["code"], "TOOL_NOT_FOUND");
    assert_eq!(
        normalized(&hidden, "ledger"),
        normalized(&missing, "ledgex")
    );
    let header_names = |answer: &Answer| {
        let mut names: Vec<String> = answer.headers.keys().map(ToString::to_string).collect();
        names.sort();
        names
    };
    assert_eq!(header_names(&hidden), header_names(&missing));

    let allowed = send(
        &router,
        execute_request(
            &call("ledger"),
            &[("authorization", bearer(KNOWN_TOKEN).as_str())],
        ),
    )
    .await;
    assert_eq!(allowed.status, StatusCode::OK);
    assert_eq!(allowed.json()["data"]["text"], "ledger: x");
}

#[tokio::test]
async fn tokens_are_verified_and_never_downgraded() {
    let probe = Probe::default();
    let router = app(&probe).router().unwrap();
    let wipe = json!({ "tool": "wipe" });

    // The internal token carries `confirm:wipe`.
    let granted = send(
        &router,
        execute_request(&wipe, &[("authorization", bearer(INTERNAL_TOKEN).as_str())]),
    )
    .await;
    assert_eq!(granted.status, StatusCode::OK);
    assert_eq!(granted.json()["data"]["text"], "wiped by assistant");

    let mut one_byte_off = INTERNAL_TOKEN.as_bytes().to_vec();
    *one_byte_off.last_mut().unwrap() ^= 1;
    let one_byte_off = String::from_utf8(one_byte_off).unwrap();
    for authorization in [
        bearer(&one_byte_off),
        bearer(&INTERNAL_TOKEN[..INTERNAL_TOKEN.len() - 1]),
        format!("Basic {INTERNAL_TOKEN}"),
        "Bearer ".to_owned(),
    ] {
        let refused = send(
            &router,
            execute_request(&wipe, &[("authorization", authorization.as_str())]),
        )
        .await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED, "{authorization}");
        assert_eq!(
            refused.header("www-authenticate"),
            Some("Bearer realm=\"carmy\"")
        );
        assert_eq!(refused.header("content-type"), Some("application/json"));
        assert_eq!(refused.header("carmy-version"), Some("1.0"));
        let body = refused.json();
        assert_eq!(body["error"]["code"], "UNAUTHENTICATED");
        assert_eq!(body["error"]["category"], "permission");
        assert!(
            !refused
                .body
                .windows(8)
                .any(|window| window == &INTERNAL_TOKEN.as_bytes()[..8])
        );
    }
    // The catalog is refused too: no listing with bad credentials.
    let catalog = send(
        &router,
        get_request(
            "/agent/tools",
            &[("authorization", bearer(&one_byte_off).as_str())],
        ),
    )
    .await;
    assert_eq!(catalog.status, StatusCode::UNAUTHORIZED);
    assert_eq!(probe.runs(), 1);
}

fn limited_app(probe: &Probe, limiter: &MemoryRateLimiter) -> Router {
    app(probe)
        .rate_limit(
            TrustLevel::Anonymous,
            RateLimit {
                requests: 3,
                window: Duration::from_secs(10),
            },
        )
        .rate_limit(
            TrustLevel::Known,
            RateLimit {
                requests: 5,
                window: Duration::from_secs(10),
            },
        )
        .rate_limiter(limiter.clone())
        .router()
        .unwrap()
}

fn echo() -> Value {
    json!({ "tool": "echo", "arguments": { "text": "hi" } })
}

#[tokio::test(start_paused = true)]
async fn the_request_over_budget_is_refused_until_the_window_passes() {
    let limiter = MemoryRateLimiter::new();
    let router = limited_app(&Probe::default(), &limiter);
    let anonymous = || from_peer(execute_request(&echo(), &[]), [10, 0, 0, 1]);

    for _ in 0..3 {
        assert_eq!(send(&router, anonymous()).await.status, StatusCode::OK);
    }
    tokio::time::advance(Duration::from_secs(4)).await;
    let refused = send(&router, anonymous()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.header("retry-after"), Some("6"));
    assert_eq!(refused.header("carmy-version"), Some("1.0"));
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "RATE_LIMITED");
    assert_eq!(error["category"], "capacity");
    assert_eq!(error["retryable"], true);
    assert_eq!(error["retry_after"], 6);

    // Another peer, and a known caller, have budgets of their own.
    let other_peer = from_peer(execute_request(&echo(), &[]), [10, 0, 0, 2]);
    assert_eq!(send(&router, other_peer).await.status, StatusCode::OK);
    let known = execute_request(&echo(), &[("authorization", bearer(KNOWN_TOKEN).as_str())]);
    assert_eq!(
        send(&router, from_peer(known, [10, 0, 0, 1])).await.status,
        StatusCode::OK
    );

    tokio::time::advance(Duration::from_secs(6)).await;
    assert_eq!(send(&router, anonymous()).await.status, StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn the_known_level_has_its_own_limit_per_principal() {
    let limiter = MemoryRateLimiter::new();
    let router = limited_app(&Probe::default(), &limiter);
    let known = || execute_request(&echo(), &[("authorization", bearer(KNOWN_TOKEN).as_str())]);
    for _ in 0..5 {
        assert_eq!(send(&router, known()).await.status, StatusCode::OK);
    }
    assert_eq!(
        send(&router, known()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The internal level is unlimited.
    let internal = || {
        execute_request(
            &echo(),
            &[("authorization", bearer(INTERNAL_TOKEN).as_str())],
        )
    };
    for _ in 0..20 {
        assert_eq!(send(&router, internal()).await.status, StatusCode::OK);
    }
}

#[tokio::test(start_paused = true)]
async fn idle_limiter_keys_are_evicted() {
    let limiter = MemoryRateLimiter::new();
    let router = limited_app(&Probe::default(), &limiter);
    for peer in 0..50 {
        let request = from_peer(get_request("/agent/tools", &[]), [10, 1, 0, peer]);
        assert_eq!(send(&router, request).await.status, StatusCode::OK);
    }
    assert_eq!(limiter.tracked_keys(), 50);
    tokio::time::advance(Duration::from_secs(11)).await;
    let request = from_peer(get_request("/agent/tools", &[]), [10, 2, 0, 1]);
    assert_eq!(send(&router, request).await.status, StatusCode::OK);
    assert_eq!(limiter.tracked_keys(), 1);
}

#[tokio::test]
async fn versions_are_negotiated_before_any_budget_is_spent() {
    let limiter = MemoryRateLimiter::new();
    let router = limited_app(&Probe::default(), &limiter);
    let with_version = |version: &str| {
        from_peer(
            execute_request(&echo(), &[("carmy-version", version)]),
            [10, 3, 0, 1],
        )
    };

    let unsupported = send(&router, with_version("2")).await;
    assert_eq!(unsupported.status, StatusCode::NOT_ACCEPTABLE);
    assert_eq!(unsupported.header("carmy-version"), Some("1.0"));
    let error = &unsupported.json()["error"];
    assert_eq!(error["code"], "UNSUPPORTED_VERSION");
    assert_eq!(error["details"]["supported"], json!(["1.0"]));

    let garbage = send(&router, with_version("banana")).await;
    assert_eq!(garbage.status, StatusCode::BAD_REQUEST);
    assert_eq!(garbage.json()["error"]["code"], "INVALID_REQUEST");
    assert_eq!(garbage.header("carmy-version"), Some("1.0"));
    assert_eq!(limiter.tracked_keys(), 0, "refused versions cost no budget");

    for version in ["1.5", "1", "1.0"] {
        let accepted = send(&router, with_version(version)).await;
        assert_eq!(accepted.status, StatusCode::OK, "{version}");
        assert_eq!(accepted.header("carmy-version"), Some("1.0"));
    }
    // Every answer carries the version, unknown routes included.
    let missing = send(&router, get_request("/nowhere", &[])).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.header("carmy-version"), Some("1.0"));
}

#[tokio::test]
async fn cors_is_off_by_default_and_allows_only_configured_origins() {
    let preflight = |origin: &str| {
        Request::options("/agent/execute")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .body(Body::empty())
            .unwrap()
    };
    let closed = app(&Probe::default()).router().unwrap();
    let answer = send(&closed, preflight("https://app.example.com")).await;
    assert_eq!(answer.header("access-control-allow-origin"), None);
    // With CORS off a preflight is an unrouted method: carmy's JSON 405, no CORS headers.
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(answer.json()["error"]["code"], "METHOD_NOT_ALLOWED");
    assert_eq!(answer.header("vary"), None);

    let open = app(&Probe::default())
        .cors_allowed_origin("https://app.example.com")
        .security_headers(true)
        .router()
        .unwrap();
    let allowed = send(&open, preflight("https://app.example.com")).await;
    assert_eq!(
        allowed.header("access-control-allow-origin"),
        Some("https://app.example.com")
    );
    let foreign = send(&open, preflight("https://evil.example")).await;
    assert_eq!(foreign.header("access-control-allow-origin"), None);

    let answer = send(&open, get_request("/agent/tools", &[])).await;
    assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
    assert_eq!(answer.header("x-frame-options"), Some("DENY"));
    let plain = send(&closed, get_request("/agent/tools", &[])).await;
    assert_eq!(plain.header("x-content-type-options"), None);
}

/// A request with two `Origin` headers could pass a CORS check on one and be judged by the
/// other: it is refused before anything runs or any budget is spent, with CORS on or off, and
/// whatever the case of the names.
#[tokio::test(start_paused = true)]
async fn a_request_with_two_origins_is_refused_and_runs_nothing() {
    let counted = json!({ "tool": "count", "arguments": { "text": "once" } });
    for cors in [false, true] {
        let probe = Probe::default();
        let mut app = app(&probe).rate_limit(
            TrustLevel::Anonymous,
            RateLimit {
                requests: 1,
                window: Duration::from_secs(60),
            },
        );
        if cors {
            app = app.cors_allowed_origin("https://app.example.com");
        }
        let router = app.router().unwrap();
        let pairs = [
            ["https://app.example.com", "https://evil.example"],
            ["https://app.example.com", "https://app.example.com"],
        ];
        for [first, second] in pairs {
            let mut request = execute_request(&counted, &[("Origin", first)]);
            request
                .headers_mut()
                .append("ORIGIN", second.parse().unwrap());
            let refused = send(&router, from_peer(request, [10, 0, 0, 7])).await;
            assert_eq!(refused.status, StatusCode::BAD_REQUEST, "cors {cors}");
            assert_eq!(refused.header("carmy-version"), Some("1.0"));
            let error = &refused.json()["error"];
            assert_eq!(error["code"], "INVALID_REQUEST");
            assert_eq!(error["message"], "the request is malformed");
            assert_eq!(
                error["details"]["reason"],
                "the request has more than one Origin"
            );
            assert_eq!(error["retryable"], false);
            assert_eq!(
                refused.header("access-control-allow-origin"),
                None,
                "cors {cors}"
            );
        }
        assert_eq!(probe.runs(), 0, "a refused request ran the tool");

        // The one request the budget allows is still there, and one Origin is served: an
        // allowed one, or (with CORS off) the server's own.
        let single = execute_request(
            &counted,
            &[
                ("origin", "https://app.example.com"),
                ("host", "app.example.com"),
            ],
        );
        let served = send(&router, from_peer(single, [10, 0, 0, 7])).await;
        assert_eq!(served.status, StatusCode::OK, "cors {cors}");
        assert_eq!(probe.runs(), 1);
        assert_eq!(
            served.header("access-control-allow-origin"),
            cors.then_some("https://app.example.com")
        );
    }
}

/// The answers whose headers are made once and copied (an execution's JSON, replayed or not, a
/// document and its `304`) carry the gate's headers exactly once, per the configuration, and over a socket the
/// length of their body (none with a `304`).
#[tokio::test]
async fn answers_copied_from_made_headers_carry_the_gate_headers_once() {
    const SECURITY: [(&str, &str); 4] = [
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        (
            "content-security-policy",
            "default-src 'none'; frame-ancestors 'none'",
        ),
    ];
    for secured in [true, false] {
        let server = Serving::start(app(&Probe::default()).security_headers(secured)).await;
        let addr = server.addr;
        let executed = send_to(addr, socket_request(addr, &echo(), &[])).await;
        let mut keyed = echo();
        keyed["request_id"] = json!(format!("made-headers-{secured}"));
        let first = send_to(addr, socket_request(addr, &keyed, &[])).await;
        let replayed = send_to(addr, socket_request(addr, &keyed, &[])).await;
        assert_eq!(first.header("carmy-replayed"), None);
        assert_eq!(replayed.headers.get_all("carmy-replayed").iter().count(), 1);
        assert_eq!(replayed.header("carmy-replayed"), Some("true"));
        assert_eq!(replayed.body, first.body);
        let catalog = send_to(addr, get_request("/agent/tools", &[])).await;
        let etag = catalog.header("etag").expect("an etag").to_owned();
        let cached = send_to(
            addr,
            get_request("/agent/tools", &[("if-none-match", &etag)]),
        )
        .await;
        assert_eq!(executed.status, StatusCode::OK);
        assert_eq!(executed.json()["data"], json!({ "text": "hi" }));
        assert_eq!(catalog.status, StatusCode::OK);
        assert_eq!(cached.status, StatusCode::NOT_MODIFIED);
        for answer in [&executed, &replayed, &catalog, &cached] {
            assert_eq!(answer.headers.get_all("carmy-version").iter().count(), 1);
            assert_eq!(answer.header("carmy-version"), Some("1.0"));
            for (name, value) in SECURITY {
                assert_eq!(
                    answer.headers.get_all(name).iter().count(),
                    usize::from(secured),
                    "{name}"
                );
                assert_eq!(answer.header(name), secured.then_some(value), "{name}");
            }
        }
        for answer in [&executed, &replayed, &catalog] {
            let length = answer.body.len().to_string();
            assert_eq!(answer.header("content-length"), Some(length.as_str()));
            assert_eq!(answer.header("content-type"), Some("application/json"));
        }
        assert_eq!(executed.header("cache-control"), Some("no-store"));
        assert_eq!(cached.header("content-length"), None);
        assert!(cached.body.is_empty());
        assert_eq!(cached.header("etag"), Some(etag.as_str()));
        assert_eq!(
            cached.header("cache-control"),
            catalog.header("cache-control")
        );
    }
}

/// The test app over a socket, served as `App::serve` serves it (peer addresses known),
/// anonymous callers allowed `requests` a minute.
async fn serve_with_anonymous_budget(requests: u32) -> Serving {
    Serving::start(app(&Probe::default()).rate_limit(
        TrustLevel::Anonymous,
        RateLimit {
            requests,
            window: Duration::from_secs(60),
        },
    ))
    .await
}

fn socket_request(addr: SocketAddr, body: &Value, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = execute_request(body, headers);
    request
        .headers_mut()
        .insert("host", addr.to_string().parse().unwrap());
    request
}

/// The status of `request` sent from the loopback address `source` (the budget of an
/// anonymous caller is its address's, computed once per connection).
async fn status_from(source: [u8; 4], addr: SocketAddr, request: Request<Body>) -> StatusCode {
    use http_body_util::BodyExt;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((source, 0))).unwrap();
    let stream = socket.connect(addr).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    response.into_body().collect().await.unwrap();
    status
}

#[tokio::test]
async fn over_a_socket_each_peer_address_has_its_own_budget() {
    let server = serve_with_anonymous_budget(1).await;
    let addr = server.addr;
    let call = || socket_request(addr, &echo(), &[]);
    assert_eq!(
        status_from([127, 0, 0, 1], addr, call()).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from([127, 0, 0, 1], addr, call()).await,
        StatusCode::TOO_MANY_REQUESTS,
        "a new connection from the same address shares its budget"
    );
    assert_eq!(
        status_from([127, 0, 0, 2], addr, call()).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from([127, 0, 0, 2], addr, call()).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn over_a_socket_peers_are_limited_and_tokens_checked() {
    let server = serve_with_anonymous_budget(2).await;
    let addr = server.addr;

    let hidden = send_to(
        addr,
        socket_request(
            addr,
            &json!({ "tool": "ledger", "arguments": { "text": "x" } }),
            &[],
        ),
    )
    .await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    assert_eq!(hidden.header("carmy-version"), Some("1.0"));
    assert_eq!(
        send_to(addr, socket_request(addr, &echo(), &[]))
            .await
            .status,
        StatusCode::OK
    );
    let limited = send_to(addr, socket_request(addr, &echo(), &[])).await;
    assert_eq!(limited.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.header("retry-after").is_some());

    // A forged X-Forwarded-For is ignored unless configured.
    let forged = send_to(
        addr,
        socket_request(addr, &echo(), &[("x-forwarded-for", "203.0.113.9")]),
    )
    .await;
    assert_eq!(forged.status, StatusCode::TOO_MANY_REQUESTS);

    let known = send_to(
        addr,
        socket_request(
            addr,
            &json!({ "tool": "ledger", "arguments": { "text": "x" } }),
            &[("authorization", bearer(KNOWN_TOKEN).as_str())],
        ),
    )
    .await;
    assert_eq!(known.status, StatusCode::OK);
    let refused = send_to(
        addr,
        socket_request(addr, &echo(), &[("authorization", "Bearer nope")]),
    )
    .await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn two_replicas_share_limits_through_redis() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    let id = format!("shared-{}", carmy_tests::run_id());
    let replica = || async {
        let authenticator = TokenAuthenticator::new()
            .token(
                &hash_token(KNOWN_TOKEN),
                Principal::new(id.as_str(), TrustLevel::Known),
            )
            .unwrap();
        tools::app(&Probe::default())
            .authenticator(authenticator)
            .rate_limit(
                TrustLevel::Known,
                RateLimit {
                    requests: 3,
                    window: Duration::from_secs(30),
                },
            )
            .rate_limiter(
                carmy::protection::RedisRateLimiter::connect(&url)
                    .await
                    .unwrap(),
            )
            .router()
            .unwrap()
    };
    let (first, second) = (replica().await, replica().await);
    let call = || execute_request(&echo(), &[("authorization", bearer(KNOWN_TOKEN).as_str())]);
    assert_eq!(send(&first, call()).await.status, StatusCode::OK);
    assert_eq!(send(&second, call()).await.status, StatusCode::OK);
    assert_eq!(send(&first, call()).await.status, StatusCode::OK);
    let refused = send(&second, call()).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    assert_eq!(
        send(&first, call()).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_shop_example_config_grants_its_demo_tokens() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/shop/carmy.toml");
    let config =
        carmy::config::Config::parse(&std::fs::read_to_string(path).unwrap(), |_| None).unwrap();
    let router = shop::app().config(config).router().unwrap();
    let catalog = |token: Option<&str>| {
        let mut request = get_request("/agent/tools", &[]);
        if let Some(token) = token {
            request
                .headers_mut()
                .insert("authorization", bearer(token).parse().unwrap());
        }
        send(&router, request)
    };
    let anonymous = catalog(None).await;
    assert!(!tool_names(&anonymous.json()).contains(&"sales_summary"));
    let known = catalog(Some("shop-known-demo-token")).await;
    assert!(tool_names(&known.json()).contains(&"sales_summary"));
    assert_eq!(known.header("x-content-type-options"), Some("nosniff"));
    let wrong = catalog(Some("shop-known-demo-tokem")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
}
