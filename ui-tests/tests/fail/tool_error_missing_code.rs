#[derive(Debug, carmy::ToolError)]
enum ShopError {
    #[tool_error(category = "conflict", retryable)]
    OutOfStock,
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("out of stock")
    }
}

fn main() {}
