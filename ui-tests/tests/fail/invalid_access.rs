/// Reads the books.
#[carmy::tool(effect = "read", access = "admin")]
async fn books() -> Result<u64, carmy::ToolError> {
    Ok(0)
}

fn main() {}
