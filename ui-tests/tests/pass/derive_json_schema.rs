//! `#[derive(carmy::JsonSchema)]` works without a schemars dependency, on structs, enums,
//! generic and recursive types, next to other derives' attributes.

use carmy::{JsonSchema, ToolError};
use serde::{Deserialize, Serialize};

/// A tree of categories.
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Category {
    /// The category's name.
    name: String,
    /// Sub-categories.
    #[serde(default)]
    children: Vec<Category>,
}

#[derive(Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Filter {
    BySku { sku: String },
    InStock,
}

#[derive(Serialize, JsonSchema)]
struct Page<T> {
    items: Vec<T>,
}

#[derive(Serialize, carmy::JsonSchema)]
#[serde(rename = "Renamed")]
struct Original {
    #[schemars(range(min = 1))]
    value: u32,
}

/// Walks the tree.
#[carmy::tool(effect = "read")]
async fn walk(input: Category) -> Result<Page<Category>, ToolError> {
    Ok(Page { items: input.children })
}

/// Filters.
#[carmy::tool(effect = "read")]
async fn filter(input: Filter) -> Result<Original, ToolError> {
    let _ = input;
    Ok(Original { value: 1 })
}

fn main() {
    // `Filter` is an enum: its schema is not an object, which the router reports at start-up.
    let error = carmy::App::new()
        .tool(filter::TOOL)
        .router()
        .expect_err("an enum input is not an object");
    assert!(error.to_string().contains("not an object"), "{error}");
    carmy::App::new().tool(walk::TOOL).router().expect("recursive inputs work");
}
