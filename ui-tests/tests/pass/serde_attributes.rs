//! Every serde attribute schemars can describe compiles on a tool's input through
//! `#[derive(carmy::JsonSchema)]`.

use carmy::JsonSchema;
use serde::{Deserialize, Serialize};

/// A container default (`Self::default()` fills omitted fields), renamed fields, a flattened
/// struct, a skipped field and `#[cfg]`-gated fields.
#[derive(Deserialize, Serialize, JsonSchema)]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
struct Search {
    query_text: String,
    #[serde(flatten)]
    paging: Paging,
    #[serde(skip)]
    cache: Option<std::sync::Arc<()>>,
    #[cfg(any())]
    gone: NotAType,
    #[cfg(all())]
    kept: bool,
}

impl Default for Search {
    fn default() -> Self {
        Search {
            query_text: String::new(),
            paging: Paging { page: 1 },
            cache: None,
            kept: false,
        }
    }
}

#[derive(Deserialize, Serialize, JsonSchema)]
struct Paging {
    page: u32,
}

/// A generic container with `#[serde(default)]`.
#[derive(Default, Deserialize, JsonSchema)]
#[serde(default)]
struct Wrapper<T> {
    value: T,
}

/// Fields named like JSON Schema keywords.
#[derive(Deserialize, JsonSchema)]
struct Keywords {
    default: Paging,
    r#enum: Paging,
    #[serde(rename = "const")]
    constant: Paging,
}

/// Searches.
#[carmy::tool(effect = "read")]
async fn search(input: Search) -> Result<Search, carmy::ToolError> {
    Ok(input)
}

/// Wraps.
#[carmy::tool(effect = "read")]
async fn wrapped(input: Wrapper<u32>) -> Result<u32, carmy::ToolError> {
    Ok(input.value)
}

/// Keywords.
#[carmy::tool(effect = "read")]
async fn keywords(input: Keywords) -> Result<u32, carmy::ToolError> {
    Ok(input.default.page + input.r#enum.page + input.constant.page)
}

fn main() {}
