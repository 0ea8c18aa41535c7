struct Shop;

impl Shop {
    /// Counts the products.
    #[carmy::tool(effect = "read")]
    async fn count(&self) -> Result<u64, carmy::ToolError> {
        Ok(0)
    }
}

fn main() {}
