//! The catalog as MCP `Tool`s: built on a snapshot's first `tools/list`, served from memory.

use serde_json::{Value, json};

use crate::catalog::{Catalog, CatalogTool};
use crate::principal::TrustLevel;
use crate::schema;
use crate::tool::Effect;

/// The `_meta` key under which each tool carries carmy's own metadata.
pub(crate) const TOOL_META_KEY: &str = "dev.carmy/tool";

/// How long a client may cache the tool list, like the HTTP catalog's `max-age=60`.
pub(crate) const LIST_TTL_MS: u64 = 60_000;

/// The tools a caller trusted at `trust` may see, in the catalog's (name) order.
pub(crate) fn list(catalog: &Catalog, trust: TrustLevel) -> Vec<rmcp::model::Tool> {
    catalog
        .visible_to(trust)
        .map(|tool| {
            serde_json::from_value(describe(tool)).expect("a carmy tool is a valid MCP tool")
        })
        .collect()
}

/// One tool in the shape of the MCP `Tool` type.
fn describe(tool: &CatalogTool) -> Value {
    let descriptor = tool.descriptor;
    let effect = descriptor.effect;
    let mut described = json!({
        "name": descriptor.name,
        "title": title(descriptor.name),
        "description": &*tool.description,
        "inputSchema": &*tool.input_schema,
        "annotations": {
            "readOnlyHint": effect.is_read_only(),
            "destructiveHint": effect == Effect::Destructive,
            "idempotentHint": descriptor.idempotent || effect.is_read_only(),
            "openWorldHint": effect == Effect::ExternalWrite,
        },
        "_meta": { TOOL_META_KEY: {
            "effect": effect,
            "idempotent": descriptor.idempotent,
            "parallel_safe": descriptor.parallel_safe,
            "confirmation": descriptor.confirmation,
        } },
    });
    if let Some(timeout) = tool.timeout {
        described["_meta"][TOOL_META_KEY]["timeout_ms"] = json!(timeout.as_millis());
    }
    // MCP output schemas describe `structuredContent`, which is always an object: other outputs
    // are sent as text only.
    if has_structured_output(tool) {
        described["outputSchema"] = tool.output_schema().clone();
    }
    described
}

/// Whether the tool's answers carry `structuredContent`: exactly when its output is an object.
pub(crate) fn has_structured_output(tool: &CatalogTool) -> bool {
    schema::is_object_schema(tool.output_schema())
}

/// A display title from the tool's name: `create_order` → "Create order".
fn title(name: &str) -> String {
    let words = name.replace(['_', '-', '.'], " ");
    let mut chars = words.trim().chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::title;

    #[test]
    fn titles_read_as_words() {
        assert_eq!(title("create_order"), "Create order");
        assert_eq!(title("shop.list-products"), "Shop list products");
        assert_eq!(title("x"), "X");
    }
}
