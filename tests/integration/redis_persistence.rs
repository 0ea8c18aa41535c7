//! A Redis without persistence forgets every record when it restarts, and retries then run
//! again: the store warns at start-up when it can tell.

use std::sync::{Arc, Mutex};

use carmy::store::RedisStore;
use carmy_tests::{RedisServer, TempDir, server_url};
use tracing::Level;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// The events logged while it is the default subscriber, as `LEVEL message`.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<String>>>);

struct Message<'a>(&'a mut String);

impl Visit for Message<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut line = event.metadata().level().to_string();
        event.record(&mut Message(&mut line));
        self.0.lock().unwrap().push(line);
    }
}

/// What connecting to `url` logs.
async fn logged_on_connect(url: &str) -> Vec<String> {
    let events = Events::default();
    let _default = tracing::subscriber::set_default(
        tracing_subscriber::registry().with(events.clone().with_filter(
            tracing_subscriber::filter::LevelFilter::from_level(Level::DEBUG),
        )),
    );
    RedisStore::connect(url).await.expect("connects");
    events.0.lock().unwrap().clone()
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
