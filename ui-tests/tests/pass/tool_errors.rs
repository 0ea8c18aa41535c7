//! Every way a tool's error converts into `carmy::ToolError`: a domain error mapped once (derived
//! or implemented), `?` on io, serde, `anyhow` and string errors.

use carmy::{IntoToolError, ToolError};

/// Mapped once with the derive; `?` converts it in any tool.
#[derive(Debug, carmy::ToolError)]
enum ShopError {
    #[tool_error(code = "OUT_OF_STOCK", category = "conflict", suggest = "list_products")]
    OutOfStock { sku: String },
    #[tool_error(code = "WAREHOUSE_BUSY", category = "capacity", retry_after_secs = 2)]
    Busy,
    #[tool_error(code = "NOT_FOUND", category = "not_found", message = "no such order")]
    NoOrder(u64),
    #[tool_error(transparent)]
    Io(std::io::Error),
    Corrupt,
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShopError::OutOfStock { sku } => write!(f, "{sku} is out of stock"),
            ShopError::Busy => f.write_str("the warehouse is busy"),
            ShopError::NoOrder(id) => write!(f, "no order {id}"),
            ShopError::Io(error) => write!(f, "{error}"),
            ShopError::Corrupt => f.write_str("the stock file is corrupt"),
        }
    }
}

/// A struct error, mapped with the derive too.
#[derive(Debug, carmy::ToolError)]
#[tool_error(code = "PAYMENT_DECLINED", category = "validation", retryable)]
struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the card was declined")
    }
}

/// Mapped once by hand.
struct QuotaError(u32);

impl IntoToolError for QuotaError {
    fn into_tool_error(self) -> ToolError {
        ToolError::capacity("QUOTA", format!("{} calls left", self.0))
    }
}

/// A type of the user's own that converts with a plain `From` impl, which the old blanket impl
/// made impossible.
#[derive(Debug)]
struct Legacy;

impl std::fmt::Display for Legacy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("legacy")
    }
}

impl std::error::Error for Legacy {}

impl From<Legacy> for ToolError {
    fn from(_: Legacy) -> Self {
        ToolError::conflict("LEGACY", "legacy")
    }
}

/// Returns the domain error itself.
#[carmy::tool(effect = "read")]
async fn stock() -> Result<u32, ShopError> {
    Err(ShopError::Busy)
}

/// Returns a struct error.
#[carmy::tool(effect = "write")]
async fn pay() -> Result<(), Declined> {
    Err(Declined)
}

/// Returns a hand-mapped error.
#[carmy::tool(effect = "read")]
async fn quota() -> Result<(), QuotaError> {
    Err(QuotaError(0))
}

/// `?` on every kind of error in one tool.
#[carmy::tool(effect = "read")]
async fn mixed() -> Result<String, ToolError> {
    let text = std::fs::read_to_string("/nonexistent")?;
    let _: u32 = serde_json::from_str(&text)?;
    Err(ShopError::OutOfStock { sku: text.clone() })?;
    Err(ShopError::Corrupt)?;
    Err(Declined)?;
    Err(QuotaError(1))?;
    Err(Legacy)?;
    Err(anyhow::anyhow!("anyhow"))?;
    Err(String::from("a string"))?;
    Err("a str")?;
    let number: u32 = text.parse().map_err(ToolError::unexpected)?;
    Ok(number.to_string())
}

/// Returns `anyhow::Error`.
#[carmy::tool(effect = "read")]
async fn with_anyhow() -> Result<u32, anyhow::Error> {
    Ok(std::fs::read_to_string("/nonexistent")?.len().try_into()?)
}

/// Returns a `String` error.
#[carmy::tool(effect = "read")]
async fn with_string() -> Result<u32, String> {
    Err("nope".to_owned())
}

/// Returns an io error.
#[carmy::tool(effect = "read")]
async fn with_io() -> Result<String, std::io::Error> {
    std::fs::read_to_string("/nonexistent")
}

fn main() {}
