#[carmy::tool(effect = "read")]
async fn now() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
