//! The published carmy 0.6 crate serving the shop's `create_order` and `list_products`.

use carmy::prelude::*;
use carmy_bench_peers::{NewOrder, OrderError, Placed, Products, Shop};

#[carmy::tool(description = "Place an order", effect = "write")]
async fn create_order(State(shop): State<Shop>, input: NewOrder) -> AgentResult<Placed> {
    shop.create_order(input).map_err(|error| match error {
        OrderError::UnknownSku => AgentError::new("PRODUCT_NOT_FOUND", "no such product", ErrorCategory::NotFound),
        OrderError::OutOfStock => AgentError::new("OUT_OF_STOCK", "out of stock", ErrorCategory::Conflict),
    })
}

#[carmy::tool(description = "List the products", effect = "read", idempotent = true, parallel_safe = true)]
async fn list_products(State(shop): State<Shop>) -> AgentResult<Products> {
    Ok(shop.list_products())
}

#[tokio::main]
async fn main() {
    let addr = std::env::var("CARMY_ADDR").unwrap_or_else(|_| "127.0.0.1:3006".to_owned());
    carmy::Carmy::new()
        .name("shop")
        .tool(create_order)
        .tool(list_products)
        .state(Shop::default())
        .listen(addr)
        .await
        .expect("serve");
}
