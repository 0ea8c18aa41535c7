/// Echoes its input.
#[carmy::tool(effect = "none")]
async fn echo<T: serde::de::DeserializeOwned>(input: T) -> Result<u64, carmy::ToolError> {
    let _ = input;
    Ok(0)
}

fn main() {}
