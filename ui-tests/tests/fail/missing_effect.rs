/// Reads the time.
#[carmy::tool(idempotent = true)]
async fn now() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
