#[derive(serde::Deserialize, carmy::JsonSchema)]
struct Sku {
    sku: String,
}

#[derive(serde::Deserialize, carmy::JsonSchema)]
struct Quantity {
    quantity: u32,
}

/// Places an order.
#[carmy::tool(effect = "write")]
async fn create_order(sku: Sku, quantity: Quantity) -> Result<u64, carmy::ToolError> {
    let _ = (sku.sku, quantity.quantity);
    Ok(0)
}

fn main() {}
