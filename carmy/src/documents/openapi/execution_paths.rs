//! `/agent/executions` (`protocol.md` §9).

use serde_json::{Value, json};

use super::Builder;
use super::components::{
    EXECUTION_CANCEL_ERRORS, EXECUTION_EVENTS_ERRORS, EXECUTION_LIST_ERRORS, EXECUTION_READ_ERRORS,
    add_errors,
};
use crate::wire::execution_list::MAX_PAGE;
use crate::wire::paths;

/// `/agent/executions` (§9): the caller's executions, read back, followed, cancelled, listed.
pub(super) fn executions_paths(builder: &mut Builder<'_>) {
    let scope = builder.scope;
    let no_store = json!({ "$ref": "#/components/headers/NoStore" });
    let query = |name: &str, description: &str, schema: Value| json!({ "name": name, "in": "query", "description": description, "schema": schema });
    let mut responses = json!({ "200": {
        "description": "The caller's executions, newest first; `next_cursor` is null on the \
                        last page.",
        "headers": { "Cache-Control": no_store },
        "content": { "application/json": {
            "schema": { "$ref": "#/components/schemas/ExecutionList" },
        } },
    } });
    add_errors(&mut responses, scope, EXECUTION_LIST_ERRORS);
    builder.paths.insert(
        paths::EXECUTIONS.to_owned(),
        json!({ "get": {
            "operationId": "list_executions",
            "summary": "The caller's executions: async ones and those with a request id.",
            "tags": ["carmy"],
            "parameters": [
                query("status", "Only executions in this state.",
                      json!({ "$ref": "#/components/schemas/ExecutionStatus" })),
                query("tool", "Only executions of this tool.", json!({ "type": "string" })),
                query("limit", "At most this many (default 20).",
                      json!({ "type": "integer", "minimum": 1, "maximum": MAX_PAGE })),
                query("cursor", "The `next_cursor` of the previous page.",
                      json!({ "$ref": "#/components/schemas/ExecutionId" })),
            ],
            "responses": responses,
        } }),
    );

    let mut lookup = json!({ "200": {
        "description": "Once it has ended, the answer's body exactly as the call gave it, \
                        whatever the outcome: its `status` and `error` say how it ended (the \
                        replay of its `request_id` keeps the outcome's own status). While it \
                        runs, the running execution with `Retry-After`.",
        "headers": {
            "Cache-Control": no_store,
            "Retry-After": { "$ref": "#/components/headers/RetryAfter" },
        },
        "content": { "application/json": { "schema": { "anyOf": [
            { "$ref": "#/components/schemas/ExecutionResponse" },
            { "$ref": "#/components/schemas/RunningExecution" },
        ] } } },
    } });
    add_errors(&mut lookup, scope, EXECUTION_READ_ERRORS);
    let mut cancel = json!({ "202": {
        "description": "The cancellation took effect: the execution ended `cancelled` (or \
                        still ran 5 s later: the request stands). One that ended otherwise, \
                        even as the request arrived, is `409`.",
        "headers": {
            "Cache-Control": no_store,
            "Retry-After": { "$ref": "#/components/headers/RetryAfter" },
        },
        "content": { "application/json": {
            "schema": { "$ref": "#/components/schemas/RunningExecution" },
        } },
    } });
    add_errors(&mut cancel, scope, EXECUTION_CANCEL_ERRORS);
    builder.paths.insert(
        format!("{}/{{execution_id}}", paths::EXECUTIONS),
        json!({
            "parameters": [{ "$ref": "#/components/parameters/ExecutionIdPath" }],
            "get": {
                "operationId": "get_execution",
                "summary": "One of the caller's executions.",
                "tags": ["carmy"],
                "responses": lookup,
            },
            "delete": {
                "operationId": "cancel_execution",
                "summary": "Cancel one of the caller's running executions (`409` once ended).",
                "tags": ["carmy"],
                "responses": cancel,
            },
        }),
    );

    let mut events = json!({ "200": {
        "description": "The events recorded so far with their original ids, then the live \
                        ones, until the execution ends.",
        "headers": { "Cache-Control": no_store },
        // No schema: each event's `data` is a JSON object of its own kind (a stream has no
        // single schema in OpenAPI 3.1), which fuzzers would check every event against.
        "content": { "text/event-stream": {} },
    } });
    add_errors(&mut events, scope, EXECUTION_EVENTS_ERRORS);
    builder.paths.insert(
        format!("{}/{{execution_id}}/events", paths::EXECUTIONS),
        json!({ "get": {
            "operationId": "execution_events",
            "summary": "Re-attach to an execution's events (Server-Sent Events).",
            "tags": ["carmy"],
            "parameters": [
                { "$ref": "#/components/parameters/ExecutionIdPath" },
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "description": "Resume after this event.",
                    "schema": { "type": "string", "pattern": "^[0-9]{1,19}$" },
                },
            ],
            "responses": events,
        } }),
    );
}
