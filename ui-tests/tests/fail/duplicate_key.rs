/// Reads the time.
#[carmy::tool(effect = "read", idempotent = true, idempotent = false)]
async fn now() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
