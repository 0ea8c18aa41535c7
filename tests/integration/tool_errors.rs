//! A tool's own error type mapped to codes once (`#[derive(carmy::ToolError)]` or
//! `carmy::IntoToolError`), and the errors without a code (io, `anyhow`, strings) as
//! `500 INTERNAL` whose text never reaches the client.

use axum::http::StatusCode;
use carmy::{IntoToolError, JsonSchema, ToolError};
use carmy_tests::execute;
use serde::Deserialize;
use serde_json::json;

#[derive(Debug, carmy::ToolError)]
enum ShopError {
    #[tool_error(
        code = "OUT_OF_STOCK",
        category = "conflict",
        suggest = "list_products"
    )]
    OutOfStock {
        sku: String,
    },
    #[tool_error(code = "WAREHOUSE_BUSY", category = "capacity", retry_after_secs = 2)]
    Busy,
    #[tool_error(transparent)]
    Io(std::io::Error),
    Corrupt,
}

impl std::fmt::Display for ShopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShopError::OutOfStock { sku } => write!(f, "{sku} is out of stock"),
            ShopError::Busy => f.write_str("the warehouse is busy"),
            ShopError::Io(error) => write!(f, "io: {error}"),
            ShopError::Corrupt => f.write_str("secret: the stock file is corrupt"),
        }
    }
}

/// Mapped by hand.
struct Quota;

impl IntoToolError for Quota {
    fn into_tool_error(self) -> ToolError {
        ToolError::capacity("QUOTA_EXCEEDED", "no calls left today").retryable(None)
    }
}

#[derive(Deserialize, JsonSchema)]
struct Case {
    case: String,
}

fn fail(case: &str) -> Result<(), ShopError> {
    match case {
        "stock" => Err(ShopError::OutOfStock {
            sku: "MS-01".to_owned(),
        }),
        "busy" => Err(ShopError::Busy),
        "corrupt" => Err(ShopError::Corrupt),
        _ => Err(ShopError::Io(std::io::Error::other("secret: disk on fire"))),
    }
}

/// Fails the way `case` says, converting with `?`.
#[carmy::tool(effect = "none", register = false)]
async fn domain(input: Case) -> Result<(), ToolError> {
    if input.case == "quota" {
        Err(Quota)?;
    }
    fail(&input.case)?;
    Ok(())
}

/// Returns its own error type.
#[carmy::tool(effect = "none", register = false)]
async fn own_type(input: Case) -> Result<(), ShopError> {
    fail(&input.case)
}

/// `?` on an io error.
#[carmy::tool(effect = "none", register = false)]
async fn io() -> Result<String, ToolError> {
    Ok(std::fs::read_to_string("/nonexistent/secret-path")?)
}

/// Returns `anyhow::Error`.
#[carmy::tool(effect = "none", register = false)]
async fn with_anyhow() -> Result<(), anyhow::Error> {
    Err(anyhow::anyhow!("secret: anyhow"))
}

/// Returns a `String` error.
#[carmy::tool(effect = "none", register = false)]
async fn with_string() -> Result<(), String> {
    Err("secret: string".to_owned())
}

fn router() -> axum::Router {
    carmy::App::new()
        .tool(domain::TOOL)
        .tool(own_type::TOOL)
        .tool(io::TOOL)
        .tool(with_anyhow::TOOL)
        .tool(with_string::TOOL)
        .router()
        .unwrap()
}

async fn error_of(tool: &str, arguments: serde_json::Value) -> (StatusCode, serde_json::Value) {
    let answer = execute(&router(), &json!({ "tool": tool, "arguments": arguments })).await;
    (answer.status, answer.json()["error"].clone())
}

#[tokio::test]
async fn a_domain_error_keeps_its_code_category_and_retryability() {
    for tool in ["domain", "own_type"] {
        let (status, error) = error_of(tool, json!({ "case": "stock" })).await;
        assert_eq!(status, StatusCode::CONFLICT, "{tool}");
        assert_eq!(
            error,
            json!({
                "code": "OUT_OF_STOCK",
                "message": "MS-01 is out of stock",
                "category": "conflict",
                "recoverable": true,
                "retryable": false,
                "suggested_action": "list_products",
            }),
            "{tool}"
        );
        let (status, error) = error_of(tool, json!({ "case": "busy" })).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{tool}");
        assert_eq!(error["code"], "WAREHOUSE_BUSY");
        assert_eq!(error["retryable"], true);
        assert_eq!(error["retry_after"], 2);
    }
    let (status, error) = error_of("domain", json!({ "case": "quota" })).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error["code"], "QUOTA_EXCEEDED");
    assert_eq!(error["retryable"], true);
}

#[tokio::test]
async fn errors_without_a_code_are_internal_and_never_sent() {
    let cases = [
        ("own_type", json!({ "case": "corrupt" })),
        ("own_type", json!({ "case": "io" })),
        ("io", json!({})),
        ("with_anyhow", json!({})),
        ("with_string", json!({})),
    ];
    for (tool, arguments) in cases {
        let (status, error) = error_of(tool, arguments).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{tool}");
        assert_eq!(error["code"], "INTERNAL", "{tool}");
        assert_eq!(error["message"], "internal error", "{tool}");
        let text = error.to_string();
        assert!(
            !text.contains("secret") && !text.contains("nonexistent"),
            "{tool}: {text}"
        );
    }
}
