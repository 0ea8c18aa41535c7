//! The documents' own operations: discovery, the catalog, this document.

use serde_json::{Value, json};

use super::components::{DOCUMENT_ERRORS, add_errors};
use super::{Builder, OPENAPI_VERSION, Scope};
use crate::wire::paths;

pub(super) fn discovery_paths(builder: &mut Builder<'_>) {
    let scope = builder.scope;
    let mut required = vec![
        "protocol",
        "server",
        "capabilities",
        "tools_url",
        "tools_version",
        "execute_url",
        "health_url",
        "openapi_url",
    ];
    let mut properties = json!({
        "protocol": { "const": "carmy/1" },
        "server": { "type": "string" },
        "capabilities": { "type": "array", "items": { "type": "string" } },
        "tools_url": { "const": paths::CATALOG },
        "tools_version": { "$ref": "#/components/schemas/ContentHash" },
        "execute_url": { "const": paths::EXECUTE },
        "health_url": { "const": paths::HEALTH },
        "openapi_url": { "const": paths::OPENAPI },
    });
    if scope.mcp {
        required.push("mcp_url");
        properties["mcp_url"] = json!({ "const": paths::MCP });
    }
    if scope.console {
        required.push("console_url");
        properties["console_url"] = json!({ "const": paths::CONSOLE });
    }
    let schema = json!({ "type": "object", "required": required, "properties": properties });
    let mut operation = document_operation(
        scope,
        "discovery",
        "The discovery document: what this server serves, and where.",
        &schema,
    );
    if scope.console {
        let get = &mut operation["get"];
        get["description"] = json!(
            "Negotiated (`Vary: Accept, Carmy-Channel`): a person — `Accept` preferring \
             `text/html`, or `Carmy-Channel: human` — is sent to the console."
        );
        get["parameters"]
            .as_array_mut()
            .expect("a document operation lists its parameters")
            .push(json!({
                "name": "Carmy-Channel",
                "in": "header",
                "description": "Who is asking, overriding what `Accept` suggests.",
                "schema": { "enum": ["human", "agent"] },
            }));
        get["responses"]["303"] = json!({
            "description": "A person: the console is at `Location`.",
            "headers": {
                "Location": { "schema": { "const": paths::CONSOLE } },
                "Vary": { "schema": { "type": "string" } },
            },
        });
    }
    builder.paths.insert(paths::DISCOVERY.to_owned(), operation);
}

pub(super) fn catalog_paths(builder: &mut Builder<'_>) {
    let schema = json!({
        "type": "object",
        "required": ["tools"],
        "properties": {
            "tools": { "type": "array", "items": { "$ref": "#/components/schemas/CatalogEntry" } },
        },
    });
    builder.paths.insert(
        paths::CATALOG.to_owned(),
        document_operation(
            builder.scope,
            "catalog",
            "The tools the caller may call, with their schemas, sorted by name.",
            &schema,
        ),
    );
}

pub(super) fn openapi_paths(builder: &mut Builder<'_>) {
    let schema = json!({
        "type": "object",
        "required": ["openapi", "info", "paths"],
        "properties": { "openapi": { "const": OPENAPI_VERSION } },
    });
    builder.paths.insert(
        paths::OPENAPI.to_owned(),
        document_operation(
            builder.scope,
            "openapi",
            "This OpenAPI document, as the caller's trust level sees it.",
            &schema,
        ),
    );
}

/// A document served from memory: `200` with a strong `ETag`, `304` for a matching
/// `If-None-Match`. `HEAD` answers the same without a body.
pub(super) fn document_operation(
    scope: &Scope<'_>,
    id: &str,
    summary: &str,
    schema: &Value,
) -> Value {
    let headers = json!({
        "ETag": { "$ref": "#/components/headers/ETag" },
        "Cache-Control": { "$ref": "#/components/headers/DocumentCacheControl" },
    });
    let mut responses = json!({
        "200": {
            "description": "The document.",
            "headers": headers,
            "content": { "application/json": { "schema": schema } },
        },
        "304": { "description": "The client's copy is current.", "headers": headers },
    });
    add_errors(&mut responses, scope, DOCUMENT_ERRORS);
    json!({ "get": {
        "operationId": id,
        "summary": summary,
        "tags": ["carmy"],
        "parameters": [{ "$ref": "#/components/parameters/IfNoneMatch" }],
        "responses": responses,
    } })
}
