//! A test that lacks a service says so in `cargo test`'s default output, in one line naming
//! every variable it lacks, and fails instead when `CARMY_REQUIRE_SERVICES` is set (as
//! `.ci/run` sets it), so CI never skips one silently.

use std::process::Output;

use carmy_tests::{run_alone, server_url};

const NEEDS_POSTGRES: &str = "skips::postgres_answers_a_query";
/// Needs Redis, the store it tests, and PostgreSQL, where its tool records its effects.
const NEEDS_BOTH: &str = "replicas::two_replicas_sharing_redis_run_a_request_once";

const POSTGRES: &str = "CARMY_TEST_POSTGRES_URL";
const REDIS: &str = "CARMY_TEST_REDIS_URL";
const REQUIRE: &str = "CARMY_REQUIRE_SERVICES";

/// Needs PostgreSQL: the test the ones below run in a child process without it.
#[tokio::test]
async fn postgres_answers_a_query() {
    let Some(url) = server_url(POSTGRES) else {
        return;
    };
    let client = carmy_tests::postgres::client(&url).await;
    let row = client.query_one("SELECT 1::INT4", &[]).await.unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
}

/// `test` run alone without `missing`, skipping (with libtest's default output capture) or
/// required to find its services.
fn run_without(test: &str, missing: &[&str], require_services: bool) -> Output {
    let mut unset = missing.to_vec();
    unset.push(REQUIRE);
    let set: &[(&str, &str)] = if require_services {
        &[(REQUIRE, "1")]
    } else {
        &[]
    };
    run_alone(test, set, &unset)
}

/// The lines of a passing run's stderr that say a test was skipped.
fn skipped(output: &Output) -> Vec<String> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("1 passed"), "{stdout}");
    stderr
        .lines()
        .filter(|line| line.starts_with("SKIPPED"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_skipped_test_says_so_in_the_default_output() {
    let output = run_without(NEEDS_POSTGRES, &[POSTGRES], false);
    assert_eq!(
        skipped(&output),
        [format!(
            "SKIPPED {NEEDS_POSTGRES}: needs CARMY_TEST_POSTGRES_URL; .ci/run sets it"
        )]
    );
}

#[test]
fn a_missing_service_fails_when_services_are_required() {
    let output = run_without(NEEDS_POSTGRES, &[POSTGRES], true);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stdout.contains("CARMY_TEST_POSTGRES_URL is not set, and CARMY_REQUIRE_SERVICES"),
        "{stdout}"
    );
}

/// Each variable missing is named, and what the test needs it for when that is not what it
/// tests, once, in one line.
#[test]
fn a_test_that_needs_several_services_names_every_one_missing_once() {
    let output = run_without(NEEDS_BOTH, &[REDIS, POSTGRES], false);
    assert_eq!(
        skipped(&output),
        [format!(
            "SKIPPED {NEEDS_BOTH}: needs CARMY_TEST_REDIS_URL and CARMY_TEST_POSTGRES_URL (the \
             effects ledger); .ci/run sets them"
        )]
    );
    // Redis named (the test skips before it connects), PostgreSQL not.
    let output = run_alone(
        NEEDS_BOTH,
        &[(REDIS, "redis://127.0.0.1:6379")],
        &[POSTGRES, REQUIRE],
    );
    assert_eq!(
        skipped(&output),
        [format!(
            "SKIPPED {NEEDS_BOTH}: needs CARMY_TEST_POSTGRES_URL (the effects ledger); .ci/run \
             sets it"
        )]
    );

    let output = run_without(NEEDS_BOTH, &[REDIS, POSTGRES], true);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stdout.contains(
            "CARMY_TEST_REDIS_URL and CARMY_TEST_POSTGRES_URL (the effects ledger) are not set, \
             and CARMY_REQUIRE_SERVICES forbids skipping"
        ),
        "{stdout}"
    );
}
