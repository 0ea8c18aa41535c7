//! The shop's inventory, shared by the peer servers so each serves the same `create_order` and
//! `list_products` as the carmy example.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// An order to place.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NewOrder {
    /// The product to order.
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
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Placed {
    /// The new order's id.
    pub order_id: u64,
}

/// A product on sale.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Product {
    pub sku: String,
    pub name: String,
    pub price_cents: u64,
    pub stock: u64,
}

/// The products on sale.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Products {
    pub products: Vec<Product>,
}

/// Why an order failed.
#[derive(Debug)]
pub enum OrderError {
    UnknownSku,
    OutOfStock,
}

/// An order placed, kept as the example's `create_order` keeps it (for `get_order`), so the
/// peers serve the same tool, memory included; no peer reads orders back.
#[derive(Debug)]
#[allow(dead_code, reason = "kept as the example keeps it, never read")]
struct Order {
    order_id: u64,
    sku: String,
    quantity: u64,
    cancelled: bool,
}

#[derive(Debug, Clone)]
pub struct Shop {
    inner: Arc<Mutex<(BTreeMap<String, Product>, Vec<Order>)>>,
}

impl Default for Shop {
    fn default() -> Self {
        let products = [("KB-01", "Mechanical keyboard", 8_900, 1_000_000_000), ("MS-01", "Wireless mouse", 2_900, 3)]
            .into_iter()
            .map(|(sku, name, price_cents, stock)| {
                (sku.to_owned(), Product { sku: sku.to_owned(), name: name.to_owned(), price_cents, stock })
            })
            .collect();
        Shop { inner: Arc::new(Mutex::new((products, Vec::new()))) }
    }
}

impl Shop {
    pub fn create_order(&self, order: NewOrder) -> Result<Placed, OrderError> {
        let mut inner = self.inner.lock().unwrap();
        let (products, orders) = &mut *inner;
        let product = products.get_mut(&order.sku).ok_or(OrderError::UnknownSku)?;
        if product.stock < order.quantity {
            return Err(OrderError::OutOfStock);
        }
        product.stock -= order.quantity;
        let order_id = orders.len() as u64 + 1;
        orders.push(Order { order_id, sku: order.sku, quantity: order.quantity, cancelled: false });
        Ok(Placed { order_id })
    }

    pub fn list_products(&self) -> Products {
        Products { products: self.inner.lock().unwrap().0.values().cloned().collect() }
    }
}
