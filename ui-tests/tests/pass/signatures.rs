//! Every accepted signature shape compiles, with only carmy, serde and tokio as dependencies.

use carmy::{Context, JsonSchema, State, ToolError};
use serde::{Deserialize, Serialize};

#[derive(Clone)]
struct Db;

#[derive(Clone)]
struct Mailer;

#[derive(Deserialize, JsonSchema)]
struct Query {
    text: String,
}

#[derive(Serialize, JsonSchema)]
struct Hits {
    count: usize,
}

/// No parameters at all.
#[carmy::tool(effect = "none")]
async fn no_params() -> Result<u64, ToolError> {
    Ok(1)
}

/// Only an input.
#[carmy::tool(effect = "read")]
async fn input_only(input: Query) -> Result<Hits, ToolError> {
    Ok(Hits { count: input.text.len() })
}

/// Only the context.
#[carmy::tool(effect = "read")]
async fn context_only(ctx: Context) -> Result<String, ToolError> {
    Ok(ctx.execution_id().to_owned())
}

/// Only state, destructured.
#[carmy::tool(effect = "read")]
async fn state_only(State(_db): State<Db>) -> Result<(), ToolError> {
    Ok(())
}

/// Context, state and input.
#[carmy::tool(effect = "write")]
async fn ctx_state_input(ctx: Context, State(_db): State<Db>, input: Query) -> Result<Hits, ToolError> {
    ctx.progress(1, 1, None);
    Ok(Hits { count: input.text.len() })
}

/// The same in another order, with two states and a `mut` input.
#[carmy::tool(effect = "external_write")]
async fn input_first(
    mut input: Query,
    _mailer: State<Mailer>,
    _ctx: carmy::Context,
    db: carmy::State<Db>,
) -> Result<Hits, ToolError> {
    let State(Db) = db;
    input.text.push('!');
    Ok(Hits { count: input.text.len() })
}

/// An ignored input.
#[carmy::tool(effect = "none")]
async fn ignored_input(_: Query) -> Result<bool, ToolError> {
    Ok(true)
}

#[derive(Debug, carmy::ToolError)]
#[tool_error(code = "STORE_DOWN", category = "capacity", retryable)]
struct StoreDown;

impl std::fmt::Display for StoreDown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("store down")
    }
}

impl std::error::Error for StoreDown {}

/// An error type mapped with `#[derive(carmy::ToolError)]` is returned as is.
#[carmy::tool(effect = "read")]
async fn std_error() -> Result<u64, StoreDown> {
    Err(StoreDown)
}

struct Refused;

impl From<Refused> for ToolError {
    fn from(_: Refused) -> Self {
        ToolError::permission("REFUSED", "refused")
    }
}

/// A custom conversion into `ToolError`.
#[carmy::tool(effect = "read")]
async fn custom_error() -> Result<u64, Refused> {
    Err(Refused)
}

/// Every key at once.
#[carmy::tool(
    effect = "destructive",
    idempotent = true,
    parallel_safe = false,
    confirmation = "required",
    access = "partner",
    name = "every.key-v2",
    description = "Uses every key of the attribute",
    timeout = "250ms",
    register = false
)]
pub async fn every_key() -> Result<std::result::Result<u8, String>, ToolError> {
    Ok(Ok(1))
}

/// A raw identifier as the name.
#[carmy::tool(effect = "none", timeout = "2m")]
async fn r#type() -> Result<String, ToolError> {
    Ok("type".to_owned())
}

fn main() -> Result<(), carmy::Error> {
    let _registered = carmy::app().state(Db).state(Mailer).router()?;
    let _by_hand = carmy::App::new().tool(every_key::TOOL).router()?;
    assert_eq!(every_key::TOOL.name(), "every.key-v2");
    assert_eq!(every_key::TOOL.access(), carmy::TrustLevel::Partner);
    assert_eq!(r#type::TOOL.access(), carmy::TrustLevel::Anonymous);
    assert_eq!(r#type::TOOL.name(), "type");
    Ok(())
}
