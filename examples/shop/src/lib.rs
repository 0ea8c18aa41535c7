//! A small shop served to agents by carmy: browse products, place, read and cancel orders, and
//! generate a slow report (for streaming, timeout and cancellation demos).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use carmy::{Context, JsonSchema, State, ToolError};
use serde::{Deserialize, Serialize};

/// The shop's state: products with their stock, and the orders placed in this process.
#[derive(Debug, Clone)]
pub struct Shop {
    inner: Arc<Mutex<Inventory>>,
}

#[derive(Debug)]
struct Inventory {
    products: BTreeMap<String, Product>,
    orders: Vec<Order>,
}

/// A product on sale.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Product {
    /// Stock-keeping unit, the product's id.
    pub sku: String,
    /// Display name.
    pub name: String,
    /// Price of one unit, in cents.
    pub price_cents: u64,
    /// Units in stock.
    pub stock: u64,
}

/// An order placed in this shop.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct Order {
    /// The order's id; ids count from 1 in each process.
    pub order_id: u64,
    /// The product ordered.
    pub sku: String,
    /// Units ordered.
    pub quantity: u64,
    /// Whether the order stands or was cancelled.
    pub status: OrderStatus,
}

/// The life of an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OrderStatus {
    /// Placed and standing.
    Placed,
    /// Cancelled; its stock went back on the shelf.
    Cancelled,
}

impl Shop {
    /// The shop as it opens: `KB-01` with stock for load tests, `MS-01` with three units.
    pub fn new() -> Self {
        let products = [
            ("KB-01", "Mechanical keyboard", 8_900, 1_000_000_000),
            ("MS-01", "Wireless mouse", 2_900, 3),
        ]
        .into_iter()
        .map(|(sku, name, price_cents, stock)| {
            let product = Product {
                sku: sku.to_owned(),
                name: name.to_owned(),
                price_cents,
                stock,
            };
            (product.sku.clone(), product)
        })
        .collect();
        Shop {
            inner: Arc::new(Mutex::new(Inventory {
                products,
                orders: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inventory> {
        // A tool that panicked while holding the lock left consistent data: every change below
        // is made after all checks pass.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Default for Shop {
    fn default() -> Self {
        Self::new()
    }
}

/// The app: every tool of this crate, sharing one [`Shop`].
pub fn app() -> carmy::App {
    carmy::app().name("shop").state(Shop::new())
}

/// An order to place.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct NewOrder {
    /// The product to order, e.g. `KB-01`.
    pub sku: String,
    /// Units to order.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub quantity: u64,
}

fn one() -> u64 {
    1
}

/// A placed order's id.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Placed {
    /// The new order's id.
    pub order_id: u64,
}

/// Place an order.
///
/// Takes the units from stock. Not idempotent: send a `request_id` so a retry cannot order twice.
#[carmy::tool(effect = "write", idempotent = false)]
pub async fn create_order(State(shop): State<Shop>, input: NewOrder) -> Result<Placed, ToolError> {
    let mut inventory = shop.lock();
    let Some(product) = inventory.products.get_mut(&input.sku) else {
        return Err(ShopError::ProductNotFound { sku: input.sku }.into());
    };
    if product.stock < input.quantity {
        return Err(ToolError::conflict(
            "OUT_OF_STOCK",
            format!("only {} of `{}` left", product.stock, input.sku),
        )
        .details(serde_json::json!({ "sku": input.sku, "stock": product.stock }))
        .suggest("list_products"));
    }
    product.stock -= input.quantity;
    let order_id = inventory.orders.len() as u64 + 1;
    inventory.orders.push(Order {
        order_id,
        sku: input.sku,
        quantity: input.quantity,
        status: OrderStatus::Placed,
    });
    Ok(Placed { order_id })
}

/// Which order.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct OrderRef {
    /// The order's id, as `create_order` returned it.
    pub order_id: u64,
}

/// Read an order.
#[carmy::tool(effect = "read", idempotent = true)]
pub async fn get_order(State(shop): State<Shop>, input: OrderRef) -> Result<Order, ShopError> {
    shop.lock()
        .orders
        .iter()
        .find(|order| order.order_id == input.order_id)
        .cloned()
        .ok_or(ShopError::OrderNotFound(input.order_id))
}

/// The shop's own failures, mapped to codes once: a tool returns them, or `?` converts them.
#[derive(Debug, carmy::ToolError)]
pub enum ShopError {
    /// No product has this sku.
    #[tool_error(
        code = "PRODUCT_NOT_FOUND",
        category = "not_found",
        suggest = "list_products"
    )]
    ProductNotFound {
        /// The sku asked for.
        sku: String,
    },
    /// No order has this id.
    #[tool_error(code = "ORDER_NOT_FOUND", category = "not_found")]
    OrderNotFound(u64),
}

/// What the agent reads as the error's message.
impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShopError::ProductNotFound { sku } => write!(f, "no product with sku `{sku}`"),
            ShopError::OrderNotFound(order_id) => write!(f, "no order with id {order_id}"),
        }
    }
}

/// The products on sale.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Products {
    /// Every product, by sku.
    pub products: Vec<Product>,
}

/// List the products on sale, with their stock.
#[carmy::tool(effect = "read", idempotent = true)]
pub async fn list_products(State(shop): State<Shop>) -> Result<Products, ToolError> {
    Ok(Products {
        products: shop.lock().products.values().cloned().collect(),
    })
}

/// Cancel an order and put its units back in stock.
///
/// Needs the user's confirmation, granted on the server side.
#[carmy::tool(effect = "destructive", idempotent = true, confirmation = "required")]
pub async fn cancel_order(State(shop): State<Shop>, input: OrderRef) -> Result<Order, ShopError> {
    let mut inventory = shop.lock();
    let inventory = &mut *inventory;
    let order = inventory
        .orders
        .iter_mut()
        .find(|order| order.order_id == input.order_id)
        .ok_or(ShopError::OrderNotFound(input.order_id))?;
    if order.status == OrderStatus::Placed {
        order.status = OrderStatus::Cancelled;
        if let Some(product) = inventory.products.get_mut(&order.sku) {
            product.stock += order.quantity;
        }
    }
    Ok(order.clone())
}

/// How long the report takes.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReportRequest {
    /// Seconds of work, at most 10: any valid call answers well within 15 s.
    #[schemars(range(max = 10))]
    pub seconds: u64,
}

/// A finished report.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Report {
    /// The report's text.
    pub summary: String,
    /// Seconds it took.
    pub seconds: u64,
}

/// Steps of work per second, each reported as progress.
const REPORT_STEPS_PER_SECOND: u64 = 4;

/// Generate a sales report, working up to 10 seconds and reporting progress.
///
/// Stream it to watch the progress, or send `Prefer: respond-async` and read it back later.
#[carmy::tool(effect = "none")]
pub async fn generate_report(ctx: Context, input: ReportRequest) -> Result<Report, ToolError> {
    let steps = input.seconds * REPORT_STEPS_PER_SECOND;
    for step in 1..=steps {
        tokio::time::sleep(Duration::from_millis(1_000 / REPORT_STEPS_PER_SECOND)).await;
        ctx.progress(step, steps, format!("step {step} of {steps}"));
    }
    Ok(Report {
        summary: format!("sales report over {} seconds of work", input.seconds),
        seconds: input.seconds,
    })
}

/// What the shop has sold.
#[derive(Debug, Serialize, JsonSchema)]
pub struct SalesSummary {
    /// Orders standing (not cancelled).
    pub orders: u64,
    /// Units in standing orders.
    pub units: u64,
    /// What the standing orders are worth, in cents.
    pub revenue_cents: u64,
}

/// Summarize the sales: standing orders, units sold and revenue.
///
/// Business figures: only callers trusted at `known` or above see this tool.
#[carmy::tool(effect = "read", idempotent = true, access = "known")]
pub async fn sales_summary(State(shop): State<Shop>) -> Result<SalesSummary, ToolError> {
    let inventory = shop.lock();
    let standing = inventory
        .orders
        .iter()
        .filter(|order| order.status == OrderStatus::Placed);
    let mut summary = SalesSummary {
        orders: 0,
        units: 0,
        revenue_cents: 0,
    };
    for order in standing {
        let price = inventory
            .products
            .get(&order.sku)
            .map_or(0, |product| product.price_cents);
        summary.orders += 1;
        summary.units += order.quantity;
        summary.revenue_cents += price.saturating_mul(order.quantity);
    }
    Ok(summary)
}
