//! `carmy.toml` read through `carmy::config::Config::load_from`: typed values (a bool is a bool),
//! unknown keys and bad values refused with the file and line, `CARMY_*` overrides typed too.

use std::path::PathBuf;

use axum::http::StatusCode;
use carmy_tests::execute;
use serde_json::json;

use crate::tools::{self, Probe};

/// Writes `text` to a file of its own and loads it.
fn load(name: &str, text: &str) -> Result<carmy::config::Config, String> {
    let path: PathBuf =
        std::env::temp_dir().join(format!("carmy-config-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let config = carmy::config::Config::load_from(&path).map_err(|error| {
        let error = error.to_string();
        assert!(error.contains(&*path.to_string_lossy()), "no file: {error}");
        error
    });
    std::fs::remove_file(&path).unwrap();
    config
}

#[test]
fn a_bool_must_be_a_bool() {
    for value in ["\"true\"", "\"yes\"", "1"] {
        let error = load("bool", &format!("# settings\nsecurity_headers = {value}\n")).unwrap_err();
        assert!(error.contains("line 2"), "{error}");
        assert!(error.contains("security_headers = "), "{error}");
    }
}

#[test]
fn unknown_keys_and_bad_values_name_the_line() {
    let error = load("unknown", "[rate_limit]\nknown = 5\nanonymus = 3\n").unwrap_err();
    assert!(error.contains("line 3"), "{error}");
    assert!(error.contains("unknown field `anonymus`"), "{error}");
    assert!(error.contains("`anonymous`"), "{error}");

    let error = load("zero", "[rate_limit]\nknown = 0\n").unwrap_err();
    assert!(error.contains("line 2"), "{error}");

    let error = load(
        "trust",
        "[[tokens]]\nid = \"a\"\ntrust = \"root\"\nhash = \"x\"\n",
    )
    .unwrap_err();
    assert!(error.contains("line 3"), "{error}");
    assert!(error.contains("`partner`"), "{error}");

    let error = load("digest", "[[tokens]]\nid = \"a\"\n\nhash = \"plain\"\n").unwrap_err();
    assert!(error.contains(":4:"), "{error}");
    assert!(error.contains("sha256:"), "{error}");
}

#[tokio::test]
async fn a_loaded_file_applies() {
    let config = load(
        "applies",
        "security_headers = true\n[rate_limit]\nwindow_secs = 60\nanonymous = 1\n",
    )
    .unwrap();
    let router = tools::app(&Probe::default())
        .config(config)
        .router()
        .unwrap();
    let call = json!({ "tool": "echo", "arguments": { "text": "hi" } });
    let first = execute(&router, &call).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("x-content-type-options"), Some("nosniff"));
    let second = execute(&router, &call).await;
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
}

#[test]
fn overrides_are_typed_and_name_their_variable() {
    let overrides = |name: &str, value: &'static str| {
        let name = name.to_owned();
        move |asked: &str| (asked == name).then(|| value.to_owned())
    };
    let error =
        carmy::config::Config::parse("", overrides("CARMY_SECURITY_HEADERS", "yes")).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("`CARMY_SECURITY_HEADERS` (`security_headers`) must be `true` or `false`"),
        "{error}"
    );
    assert!(carmy::config::Config::parse("", overrides("CARMY_SECURITY_HEADERS", "false")).is_ok());
    assert!(
        carmy::config::Config::parse("", overrides("CARMY_RATE_LIMIT_WINDOW_SECS", "0")).is_err()
    );
    assert!(
        carmy::config::Config::parse(
            "",
            overrides("CARMY_CORS_ALLOWED_ORIGINS", "https://a, https://b")
        )
        .is_ok()
    );
}

/// Runs `load` on a thread of its own and waits at most five seconds for it: a reader without
/// a bound would read a device forever (or wait for a FIFO's writer).
fn load_within_seconds(path: PathBuf) -> Result<carmy::config::Config, String> {
    let (sender, answer) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ =
            sender.send(carmy::config::Config::load_from(&path).map_err(|error| error.to_string()));
    });
    answer
        .recv_timeout(std::time::Duration::from_secs(5))
        .expect("the file was refused within 5 s, not read without end")
}

#[cfg(unix)]
#[test]
fn a_device_or_a_fifo_is_refused_without_reading_it() {
    use std::os::unix::fs::symlink;
    let dir = carmy_tests::TempDir::new("config-device");
    let zero = dir.0.join("carmy.toml");
    symlink("/dev/zero", &zero).unwrap();
    let error = load_within_seconds(zero).unwrap_err();
    assert!(error.contains("not a regular file"), "{error}");

    let fifo = dir.0.join("fifo.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let error = load_within_seconds(fifo).unwrap_err();
    assert!(error.contains("not a regular file"), "{error}");

    let error = load_within_seconds(dir.0.clone()).unwrap_err();
    assert!(error.contains("not a regular file"), "{error}");

    // A symlink to a regular file (a Kubernetes ConfigMap's layout) is read through.
    let real = dir.0.join("real.toml");
    std::fs::write(&real, "security_headers = true\n").unwrap();
    let linked = dir.0.join("linked.toml");
    symlink(&real, &linked).unwrap();
    assert!(load_within_seconds(linked).is_ok());
}

#[test]
fn a_file_over_the_limit_is_refused() {
    let limit = usize::try_from(carmy::config::MAX_FILE_BYTES).unwrap();
    assert_eq!(limit, 1024 * 1024);
    // Comments only: valid TOML of any length, so only the size can refuse it.
    let line = format!("#{}\n", "x".repeat(1022));
    let at_limit = line.repeat(limit / line.len());
    assert_eq!(at_limit.len(), limit);
    assert!(load("at-limit", &at_limit).is_ok());
    let error = load("over-limit", &format!("{at_limit}\n")).unwrap_err();
    assert!(error.contains("larger than 1048576 bytes"), "{error}");
}

#[test]
fn an_error_on_a_huge_line_is_clipped() {
    let huge = "y".repeat(900 * 1024);
    // A string where a bool belongs: TOML quotes the line at fault.
    let error = load("huge-line", &format!("security_headers = \"{huge}\"\n")).unwrap_err();
    assert!(
        error.len() < 4096,
        "{} bytes: {}…",
        error.len(),
        &error[..200]
    );
    assert!(error.contains("line 1"), "{error}");
    assert!(error.contains("security_headers = \"yyy"), "{error}");
}
