/// Echoes its input.
#[carmy::tool(effect = "none")]
async fn echo(input: impl serde::de::DeserializeOwned) -> Result<u64, carmy::ToolError> {
    let _ = input;
    Ok(0)
}

fn main() {}
