/// Does nothing.
#[carmy::tool(effect = "none")]
async fn nothing() {}

fn main() {}
