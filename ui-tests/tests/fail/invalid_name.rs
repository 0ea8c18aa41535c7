/// Reads the time.
#[carmy::tool(effect = "read", name = "read the time")]
async fn now() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
