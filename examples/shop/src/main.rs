//! `cargo run -p shop`: serves the shop on 127.0.0.1:3000 (`CARMY_ADDR` overrides it), carmy/1,
//! MCP at `/mcp`, and the console for people at `/` and `/agent/console/`.
//! `cargo run -p shop -- mcp`: serves MCP on stdin and stdout instead.
//!
//! Idempotency records live where `CARMY_IDEMPOTENCY_URL` says (`postgres://…`, `redis://…`,
//! `file:PATH`), in memory when it is unset; a store that cannot be reached stops the start.
//!
//! Tokens, rate limits, CORS, per-tool overrides and the server's timeouts come from
//! `carmy.toml`: `CARMY_CONFIG` when set, else the example's own `examples/shop/carmy.toml`,
//! reloaded while the shop serves.

use std::io::IsTerminal;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Logs: `RUST_LOG` (default `info,rmcp=warn`: no line per MCP request) on stderr, since stdout carries MCP messages under
    // `mcp`; colours only on a terminal, so a log file or collector gets plain text.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,rmcp=warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let addr = std::env::var("CARMY_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let store = carmy::store::connect_from_env().await?;
    let config_path = std::env::var_os(carmy::config::CONFIG_PATH_VAR).map_or_else(
        || concat!(env!("CARGO_MANIFEST_DIR"), "/carmy.toml").into(),
        std::path::PathBuf::from,
    );
    // Reloaded while serving: on SIGHUP, when the file changes, on POST /agent/admin/reload.
    // The host owns `/`: the shop serves carmy's console there too, for people.
    let app = shop::app()
        .store(store)
        .config_file(&config_path)?
        .merge(axum::Router::new().route("/", axum::routing::get(carmy::console::page)));
    // The program decides its transport: `shop mcp` is for desktop hosts that start it.
    if std::env::args().nth(1).as_deref() == Some("mcp") {
        app.serve_stdio().await?;
    } else {
        app.serve(addr).await?;
    }
    Ok(())
}
