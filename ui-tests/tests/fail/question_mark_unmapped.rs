#[derive(Debug)]
struct DbError;

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("db")
    }
}

impl std::error::Error for DbError {}

fn query() -> Result<u64, DbError> {
    Err(DbError)
}

/// Counts the rows.
#[carmy::tool(effect = "read")]
async fn count() -> Result<u64, carmy::ToolError> {
    Ok(query()?)
}

fn main() {}
