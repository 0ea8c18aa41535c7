#[derive(serde::Serialize)]
struct Placed {
    order_id: u64,
}

/// Places an order.
#[carmy::tool(effect = "write")]
async fn create_order() -> Result<Placed, carmy::ToolError> {
    Ok(Placed { order_id: 1 })
}

fn main() {}
