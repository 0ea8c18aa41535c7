//! A test that lacks a service says so in `cargo test`'s default output, and fails instead when
//! `CARMY_REQUIRE_SERVICES` is set (as `.ci/run` sets it), so CI never skips one silently.

use std::process::{Command, Output};

use carmy_tests::server_url;

const NEEDS_POSTGRES: &str = "skips::postgres_answers_a_query";

/// Needs PostgreSQL: the test the two below run in a child process without it.
#[tokio::test]
async fn postgres_answers_a_query() {
    let Some(url) = server_url("CARMY_TEST_POSTGRES_URL") else {
        return;
    };
    let client = carmy_tests::postgres::client(&url).await;
    let row = client.query_one("SELECT 1::INT4", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
}

/// Runs [`postgres_answers_a_query`] in this test binary, without its URL, with libtest's
/// default output capture.
fn run_without_postgres(require_services: bool) -> Output {
    let mut command = Command::new(std::env::current_exe().expect("the test binary"));
    command
        .args(["--exact", NEEDS_POSTGRES])
        .env_remove("CARMY_TEST_POSTGRES_URL")
        .env_remove("CARMY_REQUIRE_SERVICES");
    if require_services {
        command.env("CARMY_REQUIRE_SERVICES", "1");
    }
    command.output().expect("the test binary runs")
}

#[test]
fn a_skipped_test_says_so_in_the_default_output() {
    let output = run_without_postgres(false);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    assert!(
        stderr.contains(&format!(
            "SKIPPED {NEEDS_POSTGRES}: needs CARMY_TEST_POSTGRES_URL"
        )),
        "the skip is not visible: {stderr:?}"
    );
}

#[test]
fn a_missing_service_fails_when_services_are_required() {
    let output = run_without_postgres(true);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stdout.contains("CARMY_TEST_POSTGRES_URL is not set, and CARMY_REQUIRE_SERVICES"),
        "{stdout}"
    );
}
