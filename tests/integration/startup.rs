//! Start-up says how many tools are served, so a tool crate that was never linked shows.

use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What building `app` logs, at debug and above.
fn build_logs(app: carmy::App) -> (axum::Router, String) {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .finish();
    let router = tracing::subscriber::with_default(subscriber, || app.router().unwrap());
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    (router, text)
}

#[tokio::test]
async fn the_tools_served_are_counted_at_info_and_named_at_debug() {
    let (router, logs) = build_logs(shop::app());
    let catalog = carmy_tests::get(&router, "/agent/tools").await.json();
    let names: Vec<&str> = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    let line = logs
        .lines()
        .find(|line| line.contains("INFO") && line.contains("serving") && line.contains("tools="))
        .unwrap_or_else(|| panic!("no count line in:\n{logs}"));
    let count: usize = line
        .rsplit_once("tools=")
        .and_then(|(_, count)| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(line.contains(&format!("serving {count} tools")), "{line}");
    let named = logs
        .lines()
        .filter(|line| line.contains("DEBUG") && line.contains("serving tool"))
        .count();
    assert_eq!(named, count, "{logs}");
    // The catalog shows an anonymous caller part of them; each is named.
    assert!(names.len() <= count);
    for name in names {
        assert!(
            logs.lines()
                .any(|line| line.contains("DEBUG") && line.contains(&format!("tool=\"{name}\""))),
            "{name} in:\n{logs}"
        );
    }
}

#[test]
fn serving_no_tools_is_a_warning() {
    let (_, logs) = build_logs(carmy::App::new());
    let line = logs
        .lines()
        .find(|line| line.contains("serving 0 tools"))
        .unwrap_or_else(|| panic!("no count line in:\n{logs}"));
    assert!(line.contains("WARN"), "{line}");
}
