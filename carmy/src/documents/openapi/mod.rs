//! The OpenAPI 3.1 document of one trust level (`protocol.md` §11), generated from the catalog
//! and the schemas the tools' types already derive: no second schema source. It describes
//! carmy/1 precisely enough for a fuzzer: every status carmy can answer, with its body.
//!
//! The document is a list of path groups; an endpoint group adds one function to
//! [`PATH_GROUPS`], in the file of its area. Serving it (ETag, `304`) is the HTTP layer's
//! business.

mod call_paths;
mod components;
mod document_paths;
mod execution_paths;
mod operation_paths;
mod webhooks;

use serde_json::{Map, Value, json};

use crate::catalog::Catalog;
use crate::principal::TrustLevel;
use call_paths::{execute_paths, tool_paths};
use components::{common_headers, common_parameters, common_schemas, error_responses};
use document_paths::{catalog_paths, discovery_paths, openapi_paths};
use execution_paths::executions_paths;
use operation_paths::{admin_paths, health_paths, subscription_paths};
use webhooks::webhooks;

pub(super) const OPENAPI_VERSION: &str = "3.1.0";

/// What the document of one trust level describes besides the catalog.
pub(crate) struct Scope<'a> {
    /// The application's name: the document's title.
    pub(crate) server: &'a str,
    /// The catalog's content hash at this level: the document's version.
    pub(crate) tools_version: &'a str,
    pub(crate) trust: TrustLevel,
    /// An authenticator is configured: bearer authentication is declared, as optional.
    pub(crate) bearer: bool,
    /// MCP is served; discovery announces it.
    pub(crate) mcp: bool,
    /// Events are delivered: the subscription routes exist (for internal callers).
    pub(crate) events: bool,
    /// The console is served: discovery sends people to it.
    pub(crate) console: bool,
}

/// The document under construction: what a path group reads and adds to.
pub(super) struct Builder<'a> {
    pub(super) scope: &'a Scope<'a>,
    pub(super) catalog: &'a Catalog,
    pub(super) paths: Map<String, Value>,
    /// `components.schemas`: the shared shapes, and the definitions of recursive tool types.
    pub(super) schemas: Map<String, Value>,
}

/// Adds the operations of one endpoint group.
type PathGroup = fn(&mut Builder<'_>);

/// The endpoint groups, in document order. A management group checks `scope.trust` and adds
/// nothing below `internal`.
const PATH_GROUPS: &[PathGroup] = &[
    discovery_paths,
    catalog_paths,
    openapi_paths,
    execute_paths,
    tool_paths,
    executions_paths,
    health_paths,
    admin_paths,
    subscription_paths,
];

/// The OpenAPI document a caller trusted at `scope.trust` sees: only the tools it may call.
pub(crate) fn document(catalog: &Catalog, scope: &Scope<'_>) -> Value {
    let mut builder = Builder {
        scope,
        catalog,
        paths: Map::new(),
        schemas: common_schemas(),
    };
    for group in PATH_GROUPS {
        group(&mut builder);
    }
    let Builder { paths, schemas, .. } = builder;
    let mut components = json!({
        "schemas": schemas,
        "responses": error_responses(),
        "headers": common_headers(),
        "parameters": common_parameters(),
    });
    let mut document = json!({
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": scope.server,
            "version": scope.tools_version,
            "description": format!(
                "The carmy/1 API of `{}` as a caller trusted at `{}` sees it: one operation \
                 per tool (`POST /agent/tools/{{name}}`) besides the protocol's own endpoints.",
                scope.server,
                scope.trust.as_str()
            ),
        },
        "paths": paths,
        "webhooks": webhooks(),
    });
    if scope.bearer {
        components["securitySchemes"] = json!({ "bearer": { "type": "http", "scheme": "bearer" } });
        // Optional: an anonymous caller is served too, with what anonymous callers may see.
        document["security"] = json!([{}, { "bearer": [] }]);
    }
    document["components"] = components;
    document
}

impl Builder<'_> {
    /// A tool's schema, placed inside the document. JSON pointers into its own `$defs` (the
    /// definitions of recursive types) would resolve against the document's root, so the
    /// definitions move to `components.schemas` under names prefixed with the tool's, and the
    /// references follow; a reference to the whole schema (`#`) points at it there too.
    fn embed(&mut self, schema: &Value, tool: &str, role: &str) -> Value {
        let prefix = format!("{tool}.{role}");
        let mut schema = schema.clone();
        let definitions = schema
            .as_object_mut()
            .and_then(|root| root.remove("$defs"))
            .and_then(|definitions| match definitions {
                Value::Object(definitions) => Some(definitions),
                _ => None,
            })
            .unwrap_or_default();
        let mut self_referenced = false;
        for (name, mut definition) in definitions {
            self_referenced |= rewrite_references(&mut definition, &prefix);
            self.schemas
                .insert(component_name(&prefix, &name), definition);
        }
        self_referenced |= rewrite_references(&mut schema, &prefix);
        if !self_referenced {
            return schema;
        }
        self.schemas.insert(prefix.clone(), schema);
        json!({ "$ref": format!("#/components/schemas/{prefix}") })
    }
}

/// Points `#/$defs/X` at the moved definition and `#` at the schema's own component; true if
/// the schema refers to itself.
fn rewrite_references(schema: &mut Value, prefix: &str) -> bool {
    match schema {
        Value::Object(object) => {
            let mut self_referenced = false;
            for (key, value) in object.iter_mut() {
                match (key.as_str(), &*value) {
                    ("$ref", Value::String(reference)) if reference == "#" => {
                        *value = json!(format!("#/components/schemas/{prefix}"));
                        self_referenced = true;
                    }
                    ("$ref", Value::String(reference)) => {
                        if let Some(pointer) = reference.strip_prefix("#/$defs/") {
                            let (name, rest) = pointer.split_once('/').unwrap_or((pointer, ""));
                            let mut target =
                                format!("#/components/schemas/{}", component_name(prefix, name));
                            if !rest.is_empty() {
                                target = format!("{target}/{rest}");
                            }
                            *value = json!(target);
                        }
                    }
                    _ => self_referenced |= rewrite_references(value, prefix),
                }
            }
            self_referenced
        }
        Value::Array(items) => items.iter_mut().fold(false, |found, item| {
            rewrite_references(item, prefix) | found
        }),
        _ => false,
    }
}

/// A component name (`[A-Za-z0-9._-]+`) for the definition `name` of the schema at `prefix`.
fn component_name(prefix: &str, name: &str) -> String {
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{prefix}.{name}")
}

#[cfg(test)]
mod tests {
    use super::components::ERROR_STATUSES;
    use crate::tool_error::{Category, status_for};
    use crate::wire::codes;

    #[test]
    fn every_status_an_error_can_take_is_documented() {
        let categories = [
            Category::Validation,
            Category::Permission,
            Category::NotFound,
            Category::Conflict,
            Category::Cancelled,
            Category::Internal,
            Category::Capacity,
            Category::Timeout,
        ];
        // A new category breaks this match, and so joins the list above.
        for category in categories {
            match category {
                Category::Validation
                | Category::Permission
                | Category::NotFound
                | Category::Conflict
                | Category::Cancelled
                | Category::Internal
                | Category::Capacity
                | Category::Timeout => {}
            }
        }
        // Codes with a status of their own; `405` is for undeclared methods, never documented.
        let coded = [
            (Category::Validation, codes::PAYLOAD_TOO_LARGE),
            (Category::Permission, codes::UNAUTHENTICATED),
            (Category::Capacity, codes::RATE_LIMITED),
            (Category::Validation, codes::UNSUPPORTED_VERSION),
        ];
        let statuses = categories
            .iter()
            .map(|&category| status_for(Some(category), None))
            .chain(
                coded
                    .iter()
                    .map(|&(category, code)| status_for(Some(category), Some(code))),
            );
        for status in statuses {
            assert!(
                ERROR_STATUSES
                    .iter()
                    .any(|&(documented, _)| documented == status.as_u16()),
                "{status} is not documented"
            );
        }
    }
}
