/// Reads the time.
#[carmy::tool(effect = "readonly")]
async fn now() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
