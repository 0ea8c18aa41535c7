/// Deletes everything.
#[carmy::tool(effect = "destructive", confirmation = "always")]
async fn wipe() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
