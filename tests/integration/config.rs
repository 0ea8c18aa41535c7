//! `carmy.toml` read through `carmy::Config::load_from`: typed values (a bool is a bool),
//! unknown keys and bad values refused with the file and line, `CARMY_*` overrides typed too.

use std::path::PathBuf;

use axum::http::StatusCode;
use carmy_tests::execute;
use serde_json::json;

use crate::tools::{self, Probe};

/// Writes `text` to a file of its own and loads it.
fn load(name: &str, text: &str) -> Result<carmy::Config, String> {
    let path: PathBuf =
        std::env::temp_dir().join(format!("carmy-config-{}-{name}.toml", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let config = carmy::Config::load_from(&path).map_err(|error| {
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
    let error = carmy::Config::parse("", overrides("CARMY_SECURITY_HEADERS", "yes")).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("`CARMY_SECURITY_HEADERS` (`security_headers`) must be `true` or `false`"),
        "{error}"
    );
    assert!(carmy::Config::parse("", overrides("CARMY_SECURITY_HEADERS", "false")).is_ok());
    assert!(carmy::Config::parse("", overrides("CARMY_RATE_LIMIT_WINDOW_SECS", "0")).is_err());
    assert!(
        carmy::Config::parse(
            "",
            overrides("CARMY_CORS_ALLOWED_ORIGINS", "https://a, https://b")
        )
        .is_ok()
    );
}
