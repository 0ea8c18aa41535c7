//! A carmy server started the way a user's `main` starts one, for the connection and shutdown
//! tests that need a whole process (a lowered file-descriptor limit, a real SIGTERM, its own
//! argv): installs the tracing subscriber as the README shows, reads `carmy.toml` from
//! `CARMY_CONFIG`, and serves with `App::serve` on `SERVED_ADDR` until SIGTERM.

use std::io::IsTerminal;
use std::time::Duration;

use carmy::{JsonSchema, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, JsonSchema)]
struct Wait {
    /// How long the tool works before it answers.
    millis: u64,
}

#[derive(Serialize, JsonSchema)]
struct Waited {
    millis: u64,
}

/// Works for `millis`, then answers.
#[carmy::tool(effect = "read", idempotent = true, register = false)]
async fn wait(input: Wait) -> Result<Waited, ToolError> {
    tokio::time::sleep(Duration::from_millis(input.millis)).await;
    Ok(Waited {
        millis: input.millis,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let addr = std::env::var("SERVED_ADDR")?;
    carmy::App::new()
        .name("served")
        .tool(wait::TOOL)
        .load_config()?
        .serve(addr)
        .await?;
    Ok(())
}
