use carmy::Context;

/// Reads the time.
#[carmy::tool(effect = "read")]
async fn now(first: Context, second: Context) -> Result<u64, carmy::ToolError> {
    let _ = (first, second);
    Ok(0)
}

fn main() {}
