/// Reads the time.
#[carmy::tool(effect = "read")]
fn now() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
