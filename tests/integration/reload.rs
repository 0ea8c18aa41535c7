//! Configuration reload (`protocol.md` §7) on real files in temporary directories: a renamed
//! file, a Kubernetes ConfigMap symlink swap, SIGHUP, and `POST /agent/admin/reload`; files
//! that fail keep the old configuration; reloads under load never mix two configurations.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use carmy::TrustLevel;
use carmy::auth::hash_token;
use carmy_tests::wait::{PATIENCE, within};
use carmy_tests::{Answer, TempDir, bearer, execute_as, get_as, send, send_as};
use serde_json::{Value, json};

use crate::tools::{self, Probe};

const ROOT: &str = "root-token";
const OPS: &str = "ops-token";
const PLAIN: &str = "plain-token";
const NEW: &str = "new-token";

/// How long a change may take to apply by itself.
const APPLIES_WITHIN: Duration = Duration::from_secs(5);

/// The tokens every test file has: `root` (internal), `ops` (known, `manage:config`) and
/// `plain` (known).
fn tokens() -> String {
    format!(
        "[[tokens]]\nid = \"root\"\ntrust = \"internal\"\nhash = \"{}\"\n\n\
         [[tokens]]\nid = \"ops\"\ntrust = \"known\"\nhash = \"{}\"\npermissions = [\"manage:config\"]\n\n\
         [[tokens]]\nid = \"plain\"\ntrust = \"known\"\nhash = \"{}\"\n",
        hash_token(ROOT),
        hash_token(OPS),
        hash_token(PLAIN)
    )
}

/// The tokens and the one `new` (known).
fn tokens_and_new() -> String {
    format!(
        "{}\n[[tokens]]\nid = \"new\"\ntrust = \"known\"\nhash = \"{}\"\n",
        tokens(),
        hash_token(NEW)
    )
}

/// A `carmy.toml` in a directory of its own, replaced the way editors do: a new file renamed
/// over the old one.
struct ConfigFile {
    dir: TempDir,
    path: PathBuf,
}

impl ConfigFile {
    fn new(name: &str, text: &str) -> Self {
        let dir = TempDir::new(&format!("reload-{name}"));
        let path = dir.0.join("carmy.toml");
        let file = ConfigFile { dir, path };
        file.replace(text);
        file
    }

    fn replace(&self, text: &str) {
        let staged = self.dir.0.join(".carmy.toml.swp");
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(&staged, &self.path).unwrap();
    }
}

fn echo() -> Value {
    json!({ "tool": "echo", "arguments": { "text": "hi" } })
}

async fn call(router: &Router, body: &Value, token: Option<&str>) -> Answer {
    execute_as(router, body, token).await
}

async fn admin_reload(router: &Router, token: Option<&str>) -> Answer {
    send_as(router, "POST", "/agent/admin/reload", token, None).await
}

fn tools_version(router_answer: &Answer) -> String {
    router_answer.json()["tools_version"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Polls `check` until it holds, for at most [`APPLIES_WITHIN`].
async fn eventually(what: &str, check: impl AsyncFnMut() -> bool) {
    carmy_tests::wait::eventually(APPLIES_WITHIN, what, check).await;
}

fn app_with(file: &ConfigFile, probe: &Probe) -> carmy::App {
    tools::app(probe).config_file(&file.path).unwrap()
}

#[tokio::test]
async fn a_file_renamed_over_the_old_one_applies_by_itself() {
    let file = ConfigFile::new("rename", &tokens());
    let router = app_with(&file, &Probe::default()).router().unwrap();
    let before = call(&router, &echo(), Some(NEW)).await;
    assert_eq!(before.status, StatusCode::UNAUTHORIZED);

    file.replace(&tokens_and_new());
    eventually("the new token works", async || {
        call(&router, &echo(), Some(NEW)).await.status == StatusCode::OK
    })
    .await;
}

/// inotify reports opening and reading the file as events on it, the reload's own read
/// included: a file nobody changes is read again at most once after someone reads it, never in
/// a loop (each reload causing the next, as it once did: the file read several times a second
/// for as long as the server ran).
#[tokio::test]
async fn reading_the_file_does_not_reload_it_again_and_again() {
    let file = ConfigFile::new("reads", &tokens());
    let app = app_with(&file, &Probe::default());
    let reloads = app.reloads();
    let _router = app.router().unwrap();
    for _ in 0..3 {
        std::fs::read(&file.path).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Long enough for a dozen debounced rounds (250 ms each) if every read caused another.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let counts = reloads.counts();
    assert!(counts.unchanged <= 1, "{counts:?}");
    assert_eq!(counts.applied + counts.failed + counts.restart_required, 0);
    // A real change still applies, and once: no second reload follows within 2 s.
    file.replace(&tokens_and_new());
    let replaced = tokio::time::Instant::now();
    eventually("the change applies", async || reloads.counts().applied > 0).await;
    tokio::time::sleep_until(replaced + Duration::from_secs(2)).await;
    assert_eq!(reloads.counts().applied, 1, "{:?}", reloads.counts());
}

#[cfg(unix)]
#[tokio::test]
async fn a_kubernetes_configmap_symlink_swap_applies_by_itself() {
    use std::os::unix::fs::symlink;
    // The layout the kubelet writes: carmy.toml → ..data/carmy.toml, ..data → ..<timestamp>.
    let dir = TempDir::new("reload-configmap");
    let first = dir.0.join("..2026_01");
    std::fs::create_dir(&first).unwrap();
    std::fs::write(first.join("carmy.toml"), tokens()).unwrap();
    symlink("..2026_01", dir.0.join("..data")).unwrap();
    symlink("..data/carmy.toml", dir.0.join("carmy.toml")).unwrap();
    let router = tools::app(&Probe::default())
        .config_file(dir.0.join("carmy.toml"))
        .unwrap()
        .router()
        .unwrap();
    assert_eq!(
        call(&router, &echo(), Some(NEW)).await.status,
        StatusCode::UNAUTHORIZED
    );

    let second = dir.0.join("..2026_02");
    std::fs::create_dir(&second).unwrap();
    std::fs::write(second.join("carmy.toml"), tokens_and_new()).unwrap();
    symlink("..2026_02", dir.0.join("..data_tmp")).unwrap();
    std::fs::rename(dir.0.join("..data_tmp"), dir.0.join("..data")).unwrap();
    eventually("the new token works", async || {
        call(&router, &echo(), Some(NEW)).await.status == StatusCode::OK
    })
    .await;
}

#[cfg(unix)]
#[tokio::test]
async fn an_edit_in_place_applies_on_sighup() {
    let file = ConfigFile::new("sighup", &tokens());
    let router = app_with(&file, &Probe::default()).router().unwrap();
    std::fs::write(&file.path, tokens_and_new()).unwrap();
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    eventually("the new token works", async || {
        call(&router, &echo(), Some(NEW)).await.status == StatusCode::OK
    })
    .await;
}

#[tokio::test]
async fn the_admin_route_is_only_for_internal_callers_and_config_managers() {
    let file = ConfigFile::new("admin", &tokens());
    let app = app_with(&file, &Probe::default());
    let reloads = app.reloads();
    let router = app.router().unwrap();
    let unknown_route = send(
        &router,
        Request::post("/agent/admin/nothing")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    for token in [None, Some(PLAIN)] {
        let hidden = admin_reload(&router, token).await;
        assert_eq!(hidden.status, StatusCode::NOT_FOUND, "{token:?}");
        assert_eq!(hidden.body, unknown_route.body, "{token:?}");
    }
    assert_eq!(reloads.counts().unchanged, 0);

    file.replace(&tokens_and_new());
    let applied = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(applied.status, StatusCode::OK);
    assert_eq!(applied.header("content-type"), Some("application/json"));
    // The watcher may have applied the file first.
    assert!(
        ["applied", "unchanged"].contains(&applied.json()["result"].as_str().unwrap()),
        "{}",
        applied.json()
    );
    assert_eq!(
        call(&router, &echo(), Some(NEW)).await.status,
        StatusCode::OK
    );
    let again = admin_reload(&router, Some(OPS)).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(
        again.json(),
        json!({ "result": "unchanged", "tools_changed": false })
    );
    assert_eq!(reloads.counts().applied, 1);

    let with_body = send(
        &router,
        Request::post("/agent/admin/reload")
            .header("authorization", bearer(ROOT))
            .body(Body::from("{}"))
            .unwrap(),
    )
    .await;
    assert_eq!(with_body.status, StatusCode::BAD_REQUEST);
    assert_eq!(with_body.json()["error"]["code"], "INVALID_REQUEST");

    let get = get_as(&router, "/agent/admin/reload", Some(ROOT)).await;
    assert_eq!(get.status, StatusCode::METHOD_NOT_ALLOWED);
    // Another method reveals the route to nobody else either.
    for token in [None, Some(PLAIN)] {
        let hidden = get_as(&router, "/agent/admin/reload", token).await;
        assert_eq!(hidden.status, StatusCode::NOT_FOUND, "{token:?}");
        assert_eq!(hidden.body, unknown_route.body, "{token:?}");
    }
}

#[tokio::test]
async fn an_app_configured_without_a_file_has_nothing_to_reload() {
    let config = carmy::config::Config::parse(&tokens(), |_| None).unwrap();
    let router = tools::app(&Probe::default())
        .config(config)
        .router()
        .unwrap();
    let refused = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert_eq!(refused.json()["error"]["code"], "CONFIG_INVALID");
}

#[tokio::test]
async fn overrides_hide_a_tool_and_open_another_with_new_tools_versions() {
    let file = ConfigFile::new("overrides", &tokens());
    let app = shop::app().config_file(&file.path).unwrap();
    let mut changes = app.reloads().subscribe();
    let router = app.router().unwrap();
    let names = async |token: Option<&str>| -> Vec<String> {
        get_as(&router, "/agent/tools", token).await.json()["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|tool| tool["name"].as_str().unwrap().to_owned())
            .collect()
    };
    // The documents built on first request are built from the snapshot they belong to: read
    // here before the reload, they must not be served stale after it.
    let lists_summary = async |path: &str| -> bool {
        let answer = get_as(&router, path, None).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
        String::from_utf8_lossy(&answer.body).contains("sales_summary")
    };
    for path in ["/agent/openapi.json", "/agent/tools?format=openai"] {
        assert!(!lists_summary(path).await, "{path}");
    }
    let anonymous_before = names(None).await;
    assert!(!anonymous_before.contains(&"sales_summary".to_owned()));
    assert!(names(Some(ROOT)).await.contains(&"cancel_order".to_owned()));
    let discovery = get_as(&router, "/.well-known/agent", None).await;
    let (version, etag) = (
        tools_version(&discovery),
        get_as(&router, "/agent/tools", None)
            .await
            .header("etag")
            .unwrap()
            .to_owned(),
    );

    file.replace(&format!(
        "{}\n[tools.sales_summary]\naccess = \"anonymous\"\ntimeout = \"45s\"\n\n\
         [tools.cancel_order]\nenabled = false\n",
        tokens()
    ));
    let applied = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(applied.status, StatusCode::OK, "{}", applied.json());

    let anonymous = names(None).await;
    assert!(anonymous.contains(&"sales_summary".to_owned()));
    for path in ["/agent/openapi.json", "/agent/tools?format=openai"] {
        assert!(lists_summary(path).await, "{path}");
    }
    assert!(!names(Some(ROOT)).await.contains(&"cancel_order".to_owned()));
    let catalog = get_as(&router, "/agent/tools", None).await;
    let summary = catalog.json()["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "sales_summary")
        .cloned()
        .unwrap();
    assert_eq!(summary["timeout_ms"], 45_000);
    assert_ne!(catalog.header("etag").unwrap(), etag);
    let new_version = tools_version(&get_as(&router, "/.well-known/agent", None).await);
    assert_ne!(new_version, version);
    let event = within(PATIENCE, "tools.changed", changes.recv())
        .await
        .unwrap();
    assert_eq!(carmy::reload::ToolsChanged::NAME, "tools.changed");
    assert_eq!(event.tools_version(TrustLevel::Anonymous), new_version);

    let summary_call = json!({ "tool": "sales_summary", "arguments": {} });
    assert_eq!(
        call(&router, &summary_call, None).await.status,
        StatusCode::OK
    );
    let cancel = json!({ "tool": "cancel_order", "arguments": { "order_id": "o-1" } });
    let hidden = call(&router, &cancel, Some(ROOT)).await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    assert_eq!(hidden.json()["error"]["code"], "TOOL_NOT_FOUND");
}

#[tokio::test]
async fn an_unchanged_file_keeps_tools_version() {
    let file = ConfigFile::new("unchanged", &tokens());
    let app = app_with(&file, &Probe::default());
    let reloads = app.reloads();
    let mut changes = reloads.subscribe();
    let router = app.router().unwrap();
    let before = get_as(&router, "/.well-known/agent", None).await;
    // The same text written again, and the same settings written differently.
    file.replace(&tokens());
    let answer = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(answer.json()["result"], "unchanged");
    file.replace(&format!("# reformatted\n{}", tokens()));
    let answer = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(answer.json()["result"], "unchanged");
    let after = get_as(&router, "/.well-known/agent", None).await;
    assert_eq!(tools_version(&after), tools_version(&before));
    assert_eq!(after.header("etag"), before.header("etag"));
    assert_eq!(reloads.counts().applied, 0);
    assert!(changes.try_recv().is_err());

    // Settings that do not touch the catalog apply without a new version either.
    file.replace(&format!("security_headers = true\n{}", tokens()));
    let answer = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(
        answer.json(),
        json!({ "result": "applied", "tools_changed": false })
    );
    let after = get_as(&router, "/.well-known/agent", None).await;
    assert_eq!(tools_version(&after), tools_version(&before));
    assert_eq!(after.header("x-content-type-options"), Some("nosniff"));
    assert!(changes.try_recv().is_err());
}

/// The `config` check as `token`'s caller sees it.
async fn config_check(router: &Router, token: Option<&str>) -> Value {
    let health = get_as(router, "/agent/health", token).await;
    assert_eq!(health.status, StatusCode::OK);
    health.json()["checks"]["config"].clone()
}

#[tokio::test]
async fn a_failing_file_keeps_the_old_configuration_and_warns_until_a_good_one_loads() {
    let file = ConfigFile::new("broken", &tokens());
    let app = app_with(&file, &Probe::default());
    let reloads = app.reloads();
    let router = app.router().unwrap();
    assert_eq!(config_check(&router, Some(ROOT)).await["status"], "pass");

    // What is wrong, the file, and the text of the line at fault.
    let broken = [
        ("syntax", "security_headers = \n", "security_headers ="),
        ("unknown key", "[rate_limit]\nanonymus = 3\n", "anonymus"),
        ("invalid value", "[rate_limit]\nknown = 0\n", "known = 0"),
        (
            "unknown tool",
            "[tools.no_such_tool]\nenabled = false\n",
            "[tools.no_such_tool]",
        ),
        (
            "bad access",
            "[tools.echo]\naccess = \"root\"\n",
            "access =",
        ),
    ];
    for (what, tail, at_fault) in broken {
        // Each broken file also drops the token `plain`: had it applied, `plain` would fail.
        let text = format!("{}\n{tail}", tokens()).replace(&hash_token(PLAIN), &hash_token("gone"));
        let line = 1 + text
            .lines()
            .position(|line| line.starts_with(at_fault))
            .unwrap();
        file.replace(&text);
        let refused = admin_reload(&router, Some(ROOT)).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{what}");
        let error = &refused.json()["error"];
        assert_eq!(error["code"], "CONFIG_INVALID", "{what}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(&*file.path.to_string_lossy()),
            "{what}: {message}"
        );
        assert!(
            message.contains(&format!(":{line}:")) || message.contains(&format!("line {line},")),
            "{what}: line {line}: {message}"
        );
        assert_eq!(
            call(&router, &echo(), Some(PLAIN)).await.status,
            StatusCode::OK,
            "{what}"
        );
        let check = config_check(&router, Some(ROOT)).await;
        assert_eq!(check["status"], "warn", "{what}");
        assert_eq!(check["output"].as_str(), Some(message), "{what}");
        let public = config_check(&router, None).await;
        assert_eq!(public, json!({ "status": "warn" }), "{what}");
        let ready = get_as(&router, "/agent/health/ready", None).await;
        assert_eq!(ready.status, StatusCode::OK, "{what}");
    }

    file.replace(&tokens_and_new());
    let applied = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(applied.status, StatusCode::OK);
    assert_eq!(
        config_check(&router, Some(ROOT)).await,
        json!({ "status": "pass" })
    );
    assert_eq!(
        call(&router, &echo(), Some(NEW)).await.status,
        StatusCode::OK
    );
    let counts = reloads.counts();
    assert!(counts.failed >= 5, "{counts:?}");
    assert!(counts.applied >= 1, "{counts:?}");
}

/// A file of one line of almost a megabyte with an error at its start: TOML quotes the whole
/// line, and the answers that carry the error (the reload's `409`, the health check's output)
/// stay small.
#[tokio::test]
async fn an_error_on_a_huge_line_gives_small_answers() {
    let file = ConfigFile::new("huge-line", &tokens());
    let router = app_with(&file, &Probe::default()).router().unwrap();
    let huge = "y".repeat(1000 * 1024);
    file.replace(&format!("{}\nsecurity_headers = \"{huge}\"\n", tokens()));
    let refused = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert!(
        refused.body.len() < 16 * 1024,
        "{} bytes",
        refused.body.len()
    );
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("security_headers = \"yyy"), "{message}");
    let health = get_as(&router, "/agent/health", Some(ROOT)).await;
    assert!(health.body.len() < 8 * 1024, "{} bytes", health.body.len());
    assert_eq!(
        health.json()["checks"]["config"]["output"],
        message.as_str()
    );
}

/// The file replaced by a symlink to a device, or by a file over the limit: refused at once,
/// the old configuration kept.
#[cfg(unix)]
#[tokio::test]
async fn a_device_or_an_oversized_file_is_refused_on_reload() {
    let file = ConfigFile::new("device", &tokens());
    let router = app_with(&file, &Probe::default()).router().unwrap();
    let staged = file.dir.0.join(".carmy.toml.link");
    std::os::unix::fs::symlink("/dev/zero", &staged).unwrap();
    std::fs::rename(&staged, &file.path).unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(5), admin_reload(&router, Some(ROOT)))
        .await
        .expect("refused within 5 s, not read without end");
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("not a regular file"), "{message}");

    file.replace(&format!("{}\n#{}\n", tokens(), "x".repeat(1024 * 1024)));
    let refused = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("larger than 1048576 bytes"), "{message}");
    assert_eq!(
        call(&router, &echo(), Some(PLAIN)).await.status,
        StatusCode::OK
    );
}

/// A token given the anonymous callers' id would share their idempotency records and
/// executions: the file is refused on reload as at the start.
#[tokio::test]
async fn a_token_named_anonymous_is_refused_at_the_start_and_on_reload() {
    let named = |id: &str| {
        format!(
            "{}\n[[tokens]]\nid = \"{id}\"\ntrust = \"known\"\nhash = \"{}\"\n",
            tokens(),
            hash_token(NEW)
        )
    };
    let at_start = ConfigFile::new("anonymous-start", &named("anonymous"));
    let error = tools::app(&Probe::default())
        .config_file(&at_start.path)
        .unwrap_err()
        .to_string();
    assert!(error.contains("reserved"), "{error}");

    let file = ConfigFile::new("anonymous-reload", &tokens());
    let router = app_with(&file, &Probe::default()).router().unwrap();
    for id in ["anonymous", "Anonymous"] {
        file.replace(&named(id));
        let refused = admin_reload(&router, Some(ROOT)).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{id}");
        assert_eq!(refused.json()["error"]["code"], "CONFIG_INVALID", "{id}");
        let message = refused.json()["error"]["message"].to_string();
        assert!(message.contains("reserved"), "{id}: {message}");
        assert_eq!(
            call(&router, &echo(), Some(NEW)).await.status,
            StatusCode::UNAUTHORIZED,
            "{id}: the file applied"
        );
    }
}

/// A reloaded `timeout` is the deadline the call ends at and the one its error names.
#[tokio::test]
async fn a_reloaded_timeout_is_the_one_the_error_names() {
    let file = ConfigFile::new("timeout", &tokens());
    let router = app_with(&file, &Probe::default()).router().unwrap();
    file.replace(&format!(
        "{}\n[tools.slow_read]\ntimeout = \"300ms\"\n",
        tokens()
    ));
    assert_eq!(
        admin_reload(&router, Some(ROOT)).await.status,
        StatusCode::OK
    );
    // The tool's declared deadline is 2 s: the call would complete within it.
    let slow = json!({ "tool": "slow_read", "arguments": { "millis": 1500 } });
    let timed_out = call(&router, &slow, None).await;
    assert_eq!(timed_out.status, StatusCode::GATEWAY_TIMEOUT);
    let body = timed_out.json();
    assert_eq!(body["status"], "timed_out");
    assert_eq!(body["error"]["details"]["timeout_ms"], 300, "{body}");
}

#[tokio::test]
async fn a_restart_only_key_refuses_the_whole_file() {
    let file = ConfigFile::new(
        "restart",
        &format!("{}\n[server]\nhead_timeout_secs = 10\n", tokens()),
    );
    let app = app_with(&file, &Probe::default());
    let reloads = app.reloads();
    let router = app.router().unwrap();
    file.replace(&format!(
        "{}\n[server]\nhead_timeout_secs = 5\n",
        tokens_and_new()
    ));
    let refused = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    let error = &refused.json()["error"];
    assert_eq!(error["code"], "RESTART_REQUIRED");
    assert_eq!(error["details"]["key"], "server.head_timeout_secs");
    assert_eq!(
        call(&router, &echo(), Some(NEW)).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(config_check(&router, Some(ROOT)).await["status"], "warn");
    assert!(reloads.counts().restart_required >= 1);
}

#[tokio::test]
async fn a_request_in_flight_finishes_under_the_snapshot_it_started_with() {
    let file = ConfigFile::new("in-flight", &tokens());
    let probe = Probe::default();
    let router = app_with(&file, &probe).router().unwrap();
    let slow = json!({ "tool": "slow_read", "arguments": { "millis": 400 } });
    let in_flight = tokio::spawn({
        let router = router.clone();
        let slow = slow.clone();
        async move { call(&router, &slow, None).await }
    });
    probe.wait_runs(1).await;
    file.replace(&format!(
        "{}\n[tools.slow_read]\nenabled = false\n",
        tokens()
    ));
    let applied = admin_reload(&router, Some(ROOT)).await;
    assert_eq!(applied.status, StatusCode::OK);
    let refused = call(&router, &slow, None).await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);

    let finished = within(PATIENCE, "the call in flight answers", in_flight)
        .await
        .unwrap();
    assert_eq!(finished.status, StatusCode::OK, "{}", finished.json());
    assert_eq!(finished.json()["status"], "completed");
}

/// Two configurations that differ in two places read by different layers (the gate's security
/// headers and the catalog behind it): an answer from a mix of the two would show one without
/// the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reloads_under_load_lose_no_request_and_never_mix_configurations() {
    const CALLS: usize = 10_000;
    const RELOADS: usize = 100;
    const CLIENTS: usize = 8;
    let open = format!("security_headers = true\n{}", tokens());
    let closed = format!(
        "security_headers = false\n{}\n[tools.echo]\nenabled = false\n",
        tokens()
    );
    let file = ConfigFile::new("load", &open);
    let app = app_with(&file, &Probe::default());
    let reloads = app.reloads();
    let router = app.router().unwrap();

    let served_open = Arc::new(AtomicUsize::new(0));
    let served_closed = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let router = router.clone();
            let (served_open, served_closed) = (served_open.clone(), served_closed.clone());
            tokio::spawn(async move {
                for _ in 0..CALLS / CLIENTS {
                    let answer = call(&router, &echo(), None).await;
                    let headers = answer.header("x-content-type-options");
                    match answer.status {
                        StatusCode::OK => {
                            assert_eq!(headers, Some("nosniff"), "open catalog, closed headers");
                            served_open.fetch_add(1, Ordering::Relaxed);
                        }
                        StatusCode::NOT_FOUND => {
                            assert_eq!(headers, None, "closed catalog, open headers");
                            assert_eq!(answer.json()["error"]["code"], "TOOL_NOT_FOUND");
                            served_closed.fetch_add(1, Ordering::Relaxed);
                        }
                        other => panic!("lost a request: {other} {}", answer.json()),
                    }
                }
            })
        })
        .collect();
    for round in 0..RELOADS {
        file.replace(if round % 2 == 0 { &closed } else { &open });
        let answer = admin_reload(&router, Some(ROOT)).await;
        assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
        tokio::task::yield_now().await;
    }
    for client in clients {
        client.await.unwrap();
    }
    let (open, closed) = (
        served_open.load(Ordering::Relaxed),
        served_closed.load(Ordering::Relaxed),
    );
    assert_eq!(open + closed, CALLS);
    assert!(open > 0 && closed > 0, "open {open}, closed {closed}");
    assert!(reloads.counts().applied >= RELOADS as u64 / 2);
}

#[test]
fn a_config_file_that_does_not_exist_stops_the_start() {
    let missing = Path::new("/nonexistent/carmy.toml");
    let error = tools::app(&Probe::default())
        .config_file(missing)
        .unwrap_err()
        .to_string();
    assert!(error.contains("/nonexistent/carmy.toml"), "{error}");
}

/// The rate-limit backend is a health component exactly while the configuration in force sets
/// a limit: a reload that sets the first one adds it, one that removes the last removes it.
#[tokio::test]
async fn the_rate_limit_check_follows_the_reloaded_limits() {
    let Some(url) = carmy_tests::server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    let file = ConfigFile::new("rate-check", &tokens());
    let limiter = carmy::protection::RedisRateLimiter::connect(&url)
        .await
        .unwrap();
    let router = app_with(&file, &Probe::default())
        .rate_limiter(limiter)
        .health_check_interval(Duration::from_millis(20))
        .router()
        .unwrap();
    let rate_check = async || {
        get_as(&router, "/agent/health", Some(ROOT)).await.json()["checks"]["rate_limit"].clone()
    };
    // Several rounds of checks pass with no limit set, and none lists the limiter.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rate_check().await, Value::Null);

    file.replace(&format!("{}\n[rate_limit]\nanonymous = 1000\n", tokens()));
    assert_eq!(
        admin_reload(&router, Some(ROOT)).await.status,
        StatusCode::OK
    );
    eventually("the limiter is checked", async || {
        rate_check().await["status"] == "pass"
    })
    .await;

    file.replace(&tokens());
    assert_eq!(
        admin_reload(&router, Some(ROOT)).await.status,
        StatusCode::OK
    );
    eventually("the limiter is no longer listed", async || {
        rate_check().await == Value::Null
    })
    .await;
}
