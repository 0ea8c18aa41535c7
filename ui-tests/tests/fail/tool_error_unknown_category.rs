#[derive(Debug, carmy::ToolError)]
enum ShopError {
    #[tool_error(code = "OUT_OF_STOCK", category = "conflicts")]
    OutOfStock,
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("out of stock")
    }
}

fn main() {}
