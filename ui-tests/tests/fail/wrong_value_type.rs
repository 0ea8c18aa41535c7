/// Reads the time.
#[carmy::tool(effect = read, idempotent = "yes")]
async fn now() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
