#[derive(carmy::JsonSchema)]
struct NewOrder {
    sku: String,
}

/// Places an order.
#[carmy::tool(effect = "write")]
async fn create_order(input: NewOrder) -> Result<String, carmy::ToolError> {
    Ok(input.sku)
}

fn main() {}
