//! One replica of a carmy server, for the multi-replica and crash tests: its store comes from
//! `CARMY_IDEMPOTENCY_URL`, and its one tool's side effect is a row in a PostgreSQL table
//! (`REPLICA_EFFECTS_URL`) that every replica shares, so the test counts executions where they
//! land rather than in any replica's memory. Prints `listening on ADDR` once it serves.

use std::sync::Arc;
use std::time::Duration;

use carmy::{JsonSchema, State, ToolError};
use serde::{Deserialize, Serialize};

/// The shared database the tool writes to.
#[derive(Clone)]
struct Effects {
    client: Arc<tokio_postgres::Client>,
}

#[derive(Deserialize, JsonSchema)]
struct Write {
    /// Names the write; the test counts the rows with its marker.
    marker: String,
    /// How long the tool holds on after writing, before it answers.
    hold_ms: u64,
}

#[derive(Serialize, JsonSchema)]
struct Written {
    /// The process that wrote the row.
    replica: u32,
}

/// Writes a row to the shared table: not idempotent, every run is one more row.
#[carmy::tool(effect = "write", idempotent = false, timeout = "5s", register = false)]
async fn record_effect(State(effects): State<Effects>, input: Write) -> Result<Written, ToolError> {
    let replica = std::process::id();
    effects
        .client
        .execute(
            "INSERT INTO carmy_test_effects (marker, replica) VALUES ($1, $2)",
            &[&input.marker, &i64::from(replica)],
        )
        .await
        .map_err(|error| {
            ToolError::internal("EFFECT_FAILED", "could not write the effect").with_source(error)
        })?;
    tokio::time::sleep(Duration::from_millis(input.hold_ms)).await;
    Ok(Written { replica })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let effects_url = std::env::var("REPLICA_EFFECTS_URL")?;
    let (client, connection) = tokio_postgres::connect(&effects_url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS carmy_test_effects (marker text NOT NULL, replica bigint NOT NULL)",
        )
        .await?;
    let store = carmy::store::connect_from_env().await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on {}", listener.local_addr()?);
    carmy::App::new()
        .name("replica")
        .tool(record_effect::TOOL)
        .state(Effects {
            client: Arc::new(client),
        })
        .store(store)
        .serve_with_shutdown(listener, std::future::pending())
        .await?;
    Ok(())
}
