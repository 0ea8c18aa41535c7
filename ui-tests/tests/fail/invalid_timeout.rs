/// Reads the time.
#[carmy::tool(effect = "read", timeout = "30 seconds")]
async fn now() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
