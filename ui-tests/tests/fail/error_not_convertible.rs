struct NotAnError;

/// Reads the time.
#[carmy::tool(effect = "read")]
async fn now() -> Result<u64, NotAnError> {
    Err(NotAnError)
}

fn main() {}
