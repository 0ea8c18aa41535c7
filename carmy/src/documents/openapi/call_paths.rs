//! Calls: `POST /agent/execute` and one operation per tool the caller may see.

use serde_json::{Value, json};

use super::Builder;
use super::components::{EXECUTION_ERRORS, accepts_empty, add_errors};
use crate::catalog::CatalogTool;
use crate::wire::paths;

/// `POST /agent/execute`. Its `Idempotency-Key` header is left undocumented here: it must
/// equal the body's `request_id` when both are sent, which no schema can say; the per-tool
/// operations take it.
pub(super) fn execute_paths(builder: &mut Builder<'_>) {
    let tools: Vec<&CatalogTool> = builder.catalog.visible_to(builder.scope.trust).collect();
    let branches: Vec<Value> = tools
        .iter()
        .map(|tool| {
            let arguments = builder.embed(&tool.input_schema, tool.descriptor.name, "input");
            let mut required = vec!["tool"];
            if !accepts_empty(tool) {
                required.push("arguments");
            }
            json!({
                "type": "object",
                "required": required,
                "properties": {
                    "tool": { "const": tool.descriptor.name },
                    "arguments": arguments,
                    "request_id": { "$ref": "#/components/schemas/RequestId" },
                },
                "additionalProperties": false,
            })
        })
        .collect();
    // With no tool to call, any name is answered `404 TOOL_NOT_FOUND`.
    let request = if branches.is_empty() {
        json!({
            "type": "object",
            "required": ["tool"],
            "properties": {
                "tool": { "type": "string" },
                "arguments": { "type": "object" },
                "request_id": { "$ref": "#/components/schemas/RequestId" },
            },
            "additionalProperties": false,
        })
    } else {
        json!({ "oneOf": branches })
    };
    let mut responses =
        execution_responses(&json!({ "$ref": "#/components/schemas/ExecutionResponse" }));
    add_errors(&mut responses, builder.scope, EXECUTION_ERRORS);
    let operation = json!({
        "operationId": "execute",
        "summary": "Run a tool by name.",
        "description": "Answers JSON, or Server-Sent Events with `Accept: text/event-stream`. \
                        A repeated `request_id` replays the recorded answer with \
                        `Carmy-Replayed: true`. The `Idempotency-Key` header is accepted as the \
                        same thing; when both are sent they must be equal.",
        "tags": ["carmy"],
        "parameters": [{ "$ref": "#/components/parameters/Prefer" }],
        "requestBody": {
            "required": true,
            "content": { "application/json": { "schema": request } },
        },
        "responses": responses,
    });
    builder
        .paths
        .insert(paths::EXECUTE.to_owned(), json!({ "post": operation }));
}

/// One operation per tool the caller may see: `POST /agent/tools/{name}` with the arguments
/// object as the body, answered exactly as `/agent/execute` answers.
pub(super) fn tool_paths(builder: &mut Builder<'_>) {
    let tools: Vec<&CatalogTool> = builder.catalog.visible_to(builder.scope.trust).collect();
    for tool in tools {
        let descriptor = tool.descriptor;
        let name = descriptor.name;
        let input = builder.embed(&tool.input_schema, name, "input");
        let output = builder.embed(tool.output_schema(), name, "output");
        let execution = json!({
            "allOf": [
                { "$ref": "#/components/schemas/ExecutionResponse" },
                { "properties": { "data": output } },
            ],
        });
        let mut responses = execution_responses(&execution);
        add_errors(&mut responses, builder.scope, EXECUTION_ERRORS);
        let summary = tool.description.lines().next().unwrap_or_default();
        let mut operation = json!({
            "operationId": name,
            "summary": summary,
            "description": &*tool.description,
            "tags": ["tools"],
            "parameters": [
                { "$ref": "#/components/parameters/IdempotencyKey" },
                { "$ref": "#/components/parameters/Prefer" },
            ],
            "requestBody": {
                // Required: a call without `Content-Type: application/json` is refused, and
                // one with it has a body (an empty one is `{}`, not documented).
                "required": true,
                "content": { "application/json": { "schema": input } },
            },
            "responses": responses,
            "x-carmy-effect": descriptor.effect.as_str(),
            "x-carmy-idempotent": descriptor.idempotent,
            "x-carmy-parallel-safe": descriptor.parallel_safe,
            "x-carmy-confirmation": descriptor.confirmation.as_str(),
        });
        operation["x-carmy-mode"] = json!(descriptor.mode.as_str());
        if let Some(timeout) = tool.timeout {
            operation["x-carmy-timeout-ms"] = json!(timeout.as_millis());
        }
        builder
            .paths
            .insert(paths::tool(name), json!({ "post": operation }));
    }
}

/// The `200` of an execution: JSON (`success`), or the event stream when asked for.
pub(super) fn execution_responses(success: &Value) -> Value {
    json!({
        "200": {
            "description": "The tool completed. With `Accept: text/event-stream`: \
                            `execution.started`, `tool.progress`…, then `execution.completed` \
                            carrying this body plus `replayed` (a failure is then also a `200` \
                            stream whose last event carries the error).",
            "headers": {
                "Cache-Control": { "$ref": "#/components/headers/NoStore" },
                "Carmy-Replayed": { "$ref": "#/components/headers/CarmyReplayed" },
            },
            "content": {
                "application/json": { "schema": success },
                "text/event-stream": {},
            },
        },
        "202": {
            "description": "Started detached (`Prefer: respond-async`, or a `mode = \"async\"` \
                            tool, for an identified caller): read it back at `Location`.",
            "headers": {
                "Cache-Control": { "$ref": "#/components/headers/NoStore" },
                "Retry-After": { "$ref": "#/components/headers/RetryAfter" },
                "Location": { "schema": { "type": "string" } },
                "Preference-Applied": { "schema": { "const": "respond-async" } },
            },
            "content": { "application/json": {
                "schema": { "$ref": "#/components/schemas/RunningExecution" },
            } },
        },
    })
}
