/// Greets someone.
#[carmy::tool(effect = "none")]
async fn greet(name: &str) -> Result<String, carmy::ToolError> {
    Ok(format!("hello {name}"))
}

fn main() {}
