//! A Redis without persistence forgets every record when it restarts, and retries then run
//! again: the store warns at start-up when it can tell.

use carmy::store::RedisStore;
use carmy_tests::{Captured, RedisServer, TempDir, server_url};
use tracing::Level;

/// What connecting to `url` logs.
async fn logged_on_connect(url: &str) -> Vec<String> {
    let captured = Captured::default();
    let _default = captured.set_default(Level::DEBUG);
    RedisStore::connect(url).await.expect("connects");
    captured.lines()
}

fn persistence_warnings(lines: &[String]) -> Vec<&String> {
    lines
        .iter()
        .filter(|line| line.starts_with("WARN") && line.contains("no persistence"))
        .collect()
}

#[tokio::test(flavor = "current_thread")]
async fn a_redis_without_persistence_is_a_warning_at_start_up() {
    let Some(url) = server_url("CARMY_TEST_REDIS_URL") else {
        return;
    };
    // `.ci/run` starts the shared server with `--save "" --appendonly no`.
    let lines = logged_on_connect(&url).await;
    assert_eq!(persistence_warnings(&lines).len(), 1, "{lines:#?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_redis_with_persistence_or_without_config_is_no_warning() {
    let dir = TempDir::new("redis-aof");
    let persistent = RedisServer::start(&dir.0, false, &["--save", "", "--appendonly", "yes"]);
    let lines = logged_on_connect(&format!("redis://127.0.0.1:{}", persistent.port)).await;
    assert!(persistence_warnings(&lines).is_empty(), "{lines:#?}");

    // A managed service refuses CONFIG: noted at debug level, nothing more.
    let dir = TempDir::new("redis-noconfig");
    let managed = RedisServer::start(
        &dir.0,
        false,
        &[
            "--save",
            "",
            "--appendonly",
            "no",
            "--rename-command",
            "CONFIG",
            "",
        ],
    );
    let lines = logged_on_connect(&format!("redis://127.0.0.1:{}", managed.port)).await;
    assert!(persistence_warnings(&lines).is_empty(), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|line| line.starts_with("DEBUG") && line.contains("persistence settings")),
        "{lines:#?}"
    );
}
