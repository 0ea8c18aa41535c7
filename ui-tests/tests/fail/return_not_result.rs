/// Reads the time.
#[carmy::tool(effect = "read")]
async fn now() -> u64 {
    0
}

fn main() {}
