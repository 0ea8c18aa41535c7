//! What the in-memory idempotency store costs in resident memory: `CALLS` calls (default
//! 4,000), each with its own `request_id` and a 200 KB argument that the answer echoes, to a
//! router with the default store, or with `--bytes N` a store of that byte budget
//! (`--bytes unbounded`: bounded by record count only, as before the byte bound).
//!
//! `cargo run -p carmy-tests --bin idempotency_rss -- [CALLS] [--bytes N|unbounded]`

use std::sync::Arc;

use carmy::store::MemoryStore;
use carmy::{JsonSchema, ToolError};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Serialize, Deserialize, JsonSchema)]
struct Text {
    /// Any text.
    text: String,
}

/// Returns its input.
#[carmy::tool(effect = "none", idempotent = true, register = false)]
async fn echo(input: Text) -> Result<Text, ToolError> {
    Ok(input)
}

/// The process's resident set, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut calls, mut bytes) = (4_000_usize, None);
    while let Some(arg) = args.next() {
        if arg == "--bytes" {
            bytes = match args.next().as_deref() {
                Some("unbounded") => Some(usize::MAX),
                Some(number) => Some(number.parse()?),
                None => return Err("--bytes needs a value".into()),
            };
        } else {
            calls = arg.parse()?;
        }
    }
    let store = Arc::new(match bytes {
        Some(bytes) => MemoryStore::with_limits(100_000, bytes),
        None => MemoryStore::new(),
    });
    let router = carmy::App::new()
        .name("rss")
        .tool(echo::TOOL)
        .store(Arc::clone(&store))
        .router()?;
    let text = "x".repeat(200 * 1024);
    let before = rss_mib();
    for index in 0..calls {
        let call = json!({ "tool": "echo", "arguments": { "text": text }, "request_id": format!("rss-{index}") });
        let answer = carmy_tests::execute(&router, &call).await;
        assert!(
            answer.status.is_success(),
            "call {index}: {}",
            answer.status
        );
    }
    let after = rss_mib();
    println!(
        "{calls} calls of 200 KB: RSS {before:.0} MiB -> {after:.0} MiB (+{:.0} MiB); the store \
         keeps {} records, {:.1} MiB (budget {:.0} MiB)",
        after - before,
        store.len(),
        store.bytes() as f64 / 1024.0 / 1024.0,
        store.max_bytes() as f64 / 1024.0 / 1024.0,
    );
    Ok(())
}
