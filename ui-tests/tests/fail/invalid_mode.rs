/// Builds the monthly report.
#[carmy::tool(effect = "read", mode = "asynch")]
async fn report() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
