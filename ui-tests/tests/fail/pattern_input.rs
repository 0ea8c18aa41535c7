#[derive(serde::Deserialize, carmy::JsonSchema)]
struct NewOrder {
    sku: String,
}

/// Places an order.
#[carmy::tool(effect = "write")]
async fn create_order(NewOrder { sku }: NewOrder) -> Result<String, carmy::ToolError> {
    Ok(sku)
}

fn main() {}
