//! The official MCP clients (`tests/mcp-clients/`) against the example server, over loopback
//! and over stdio: the Python SDK in both protocol generations and with the tasks extension,
//! and the TypeScript client.
//!
//! `.ci/run` installs the clients and names them in `CARMY_MCP_PYTHON` (a virtualenv's python)
//! and `CARMY_MCP_NODE` (node, with `npm ci` run in `tests/mcp-clients`), and the built example
//! in `CARMY_SHOP_BIN`. Without them the tests say so and pass, so `cargo test` works on a fresh
//! machine; with `CARMY_REQUIRE_SERVICES` set (`.ci/run`) a missing one fails.

use std::path::{Path, PathBuf};

use carmy::auth::{TokenAuthenticator, hash_token};
use carmy::{Principal, TrustLevel};
use carmy_tests::Server;

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/mcp-clients");

/// The program named by `variable`; `None` (the test skipped, saying so) when it is unset.
fn program(variable: &str) -> Option<PathBuf> {
    carmy_tests::server_url(variable).map(PathBuf::from)
}

/// Runs a client script to its end (each script gives up by itself after 60 s); fails the test
/// with its output unless it succeeds.
async fn run(program: &Path, args: &[&str]) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    carmy_tests::run_to_success(program, &args, Path::new(CLIENTS)).await;
}

/// A fresh shop (orders count from 1) on a loopback port, and its MCP URL.
async fn shop() -> (Server, String) {
    let server = Server::start(shop::app().router().unwrap()).await;
    let url = format!("http://{}/mcp", server.addr);
    (server, url)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_over_streamable_http_in_both_generations() {
    let Some(python) = program("CARMY_MCP_PYTHON") else {
        return;
    };
    for mode in ["2026-07-28", "legacy"] {
        let (_server, url) = shop().await;
        run(&python, &["client.py", mode, &url]).await;
    }
}

/// Two identified callers: tasks belong to the caller who started them (`protocol.md` §9).
const ALICE_TOKEN: &str = "mcp-tasks-alice-0123456789";
const BOB_TOKEN: &str = "mcp-tasks-bob-0123456789";

/// `tasks.py`: the SDK, given the tasks extension, gets `generate_report` as a task, polls and
/// cancels it, and reads the same execution over HTTP.
#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_takes_tool_calls_as_tasks_that_are_the_executions() {
    let Some(python) = program("CARMY_MCP_PYTHON") else {
        return;
    };
    let tokens = TokenAuthenticator::new()
        .token(
            &hash_token(ALICE_TOKEN),
            Principal::new("alice", TrustLevel::Known),
        )
        .unwrap()
        .token(
            &hash_token(BOB_TOKEN),
            Principal::new("bob", TrustLevel::Known),
        )
        .unwrap();
    let server = Server::start(shop::app().authenticator(tokens).router().unwrap()).await;
    let url = format!("http://{}/mcp", server.addr);
    run(&python, &["tasks.py", &url, ALICE_TOKEN, BOB_TOKEN]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_over_stdio_in_both_generations() {
    let Some([python, shop]) = carmy_tests::needs(["CARMY_MCP_PYTHON", "CARMY_SHOP_BIN"]) else {
        return;
    };
    let python = PathBuf::from(python);
    for mode in ["2026-07-28", "legacy"] {
        run(&python, &["client.py", mode, "--stdio", &shop, "mcp"]).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_client_over_streamable_http_in_both_generations() {
    let Some(node) = program("CARMY_MCP_NODE") else {
        return;
    };
    // `auto` probes `server/discover` and settles on 2026-07-28.
    for mode in ["auto", "legacy"] {
        let (_server, url) = shop().await;
        run(&node, &["client.mjs", mode, &url]).await;
    }
}
