//! `components`: the error responses, shared headers, parameters and schemas, and which
//! statuses each group of routes can answer.

use serde_json::{Map, Value, json};

use super::Scope;
use crate::catalog::CatalogTool;

/// Every status an error can be answered with, and when. Statuses outside a group's list
/// cannot come from that group's routes.
pub(super) const ERROR_STATUSES: &[(u16, &str)] = &[
    (
        400,
        "The request or its arguments are invalid (`INVALID_REQUEST`, `INVALID_ARGUMENTS`).",
    ),
    (401, "The credentials are not valid (`UNAUTHENTICATED`)."),
    (
        403,
        "The caller may not run this call (`PERMISSION_DENIED`, `CONFIRMATION_REQUIRED`), or a browser sent it from an origin not allowed (`ORIGIN_NOT_ALLOWED`).",
    ),
    (
        404,
        "No such tool, or one the caller may not see (`TOOL_NOT_FOUND`), or what the call names does not exist.",
    ),
    (
        406,
        "The `Carmy-Version` the client asks for is not served (`UNSUPPORTED_VERSION`).",
    ),
    (
        408,
        "The execution was cancelled, or the body did not arrive in time (`CANCELLED`, `REQUEST_TIMEOUT`).",
    ),
    (
        409,
        "The call clashes with recorded state (`IDEMPOTENCY_CONFLICT`, `EXECUTION_UNCERTAIN`, `SUBSCRIPTION_LIMIT_REACHED`, a tool's conflict).",
    ),
    (413, "The body is larger than 1 MiB (`PAYLOAD_TOO_LARGE`)."),
    (
        429,
        "The caller's rate limit is spent (`RATE_LIMITED`); `Retry-After` says when to retry.",
    ),
    (
        500,
        "The tool or the server failed (`TOOL_PANIC`, `INVALID_OUTPUT`, `INTERNAL`).",
    ),
    (
        503,
        "The server is busy or a dependency is down (`OVERLOADED`, `IDEMPOTENCY_CAPACITY`, …).",
    ),
    (504, "The execution ran past its deadline (`TIMEOUT`)."),
];

/// What every request passes first (version, credentials, rate limit).
pub(super) const DOCUMENT_ERRORS: &[u16] = &[400, 406, 429, 503];
/// Probes spend no rate-limit budget.
pub(super) const PROBE_ERRORS: &[u16] = &[400, 406];
/// A body (it must be empty), a browser's foreign origin, a refused file (`409`), a budget.
pub(super) const ADMIN_ERRORS: &[u16] = &[400, 403, 406, 409, 429];
pub(super) const SUBSCRIPTION_READ_ERRORS: &[u16] = &[400, 406, 429, 503];
/// A bad or long field, a browser's foreign origin, too many subscriptions (`409`), the body,
/// a budget, the store.
pub(super) const SUBSCRIPTION_WRITE_ERRORS: &[u16] = &[400, 403, 406, 409, 413, 429, 503];
pub(super) const SUBSCRIPTION_ONE_ERRORS: &[u16] = &[400, 403, 404, 406, 409, 413, 429, 503];
/// A bad parameter, a budget, the store.
pub(super) const EXECUTION_LIST_ERRORS: &[u16] = &[400, 406, 429, 503];
/// A malformed `Carmy-Version`, no such execution, a budget, the store: never the outcome's.
pub(super) const EXECUTION_READ_ERRORS: &[u16] = &[400, 404, 406, 429, 503];
/// A duplicated header, a browser's foreign origin, no such execution, one that has ended, a
/// budget, the store.
pub(super) const EXECUTION_CANCEL_ERRORS: &[u16] = &[400, 403, 404, 406, 409, 429, 503];
/// A bad `Last-Event-ID`, no such execution, a budget, the store.
pub(super) const EXECUTION_EVENTS_ERRORS: &[u16] = &[400, 404, 406, 429, 503];
pub(super) const EXECUTION_ERRORS: &[u16] =
    &[400, 403, 404, 406, 408, 409, 413, 429, 500, 503, 504];

/// Adds the error responses `statuses`, and `401` where credentials are checked.
pub(super) fn add_errors(responses: &mut Value, scope: &Scope<'_>, statuses: &[u16]) {
    let unauthorized = scope.bearer.then_some(401);
    for status in statuses.iter().copied().chain(unauthorized) {
        responses[status.to_string()] =
            json!({ "$ref": format!("#/components/responses/Error{status}") });
    }
}

/// `components.responses`: one per error status, each with the error envelope.
pub(super) fn error_responses() -> Value {
    let responses: Map<String, Value> = ERROR_STATUSES
        .iter()
        .map(|&(status, description)| {
            // A recorded failure replays with its status, whatever it is.
            let mut headers = json!({
                "Cache-Control": { "$ref": "#/components/headers/NoStore" },
                "Retry-After": { "$ref": "#/components/headers/RetryAfter" },
                "Carmy-Replayed": { "$ref": "#/components/headers/CarmyReplayed" },
            });
            if status == 401 {
                headers["WWW-Authenticate"] = json!({ "schema": { "type": "string" } });
            }
            let response = json!({
                "description": description,
                "headers": headers,
                "content": { "application/json": {
                    "schema": { "$ref": "#/components/schemas/ErrorResponse" },
                } },
            });
            (format!("Error{status}"), response)
        })
        .collect();
    Value::Object(responses)
}

pub(super) fn common_headers() -> Value {
    json!({
        "NoStore": {
            "description": "Answers are never cached.",
            "schema": { "const": "no-store" },
        },
        "DocumentCacheControl": { "schema": { "const": "private, max-age=60" } },
        "ETag": {
            "description": "The quoted hex SHA-256 of the body.",
            "schema": { "type": "string", "pattern": "^\"[0-9a-f]{64}\"$" },
        },
        "CarmyReplayed": {
            "description": "The answer is the one recorded for this request id; the tool did not run.",
            "schema": { "const": "true" },
        },
        "RetryAfter": {
            "description": "Seconds to wait before retrying.",
            "schema": { "type": "string", "pattern": "^[0-9]+$" },
        },
    })
}

pub(super) fn common_parameters() -> Value {
    json!({
        "IdempotencyKey": {
            "name": "Idempotency-Key",
            "in": "header",
            "description": "The request id: a repeated one replays the recorded answer. 1–256 \
                            bytes of printable ASCII (HTTP trims spaces at either end).",
            "schema": { "$ref": "#/components/schemas/IdempotencyKey" },
        },
        "Prefer": {
            "name": "Prefer",
            "in": "header",
            "description": "RFC 7240 preferences: `respond-async` starts the execution detached \
                            and answers `202`; other preferences are ignored.",
            "schema": { "type": "string" },
        },
        "ExecutionIdPath": {
            "name": "execution_id",
            "in": "path",
            "required": true,
            "description": "An execution of the caller's; any other id is `404`.",
            "schema": { "type": "string" },
        },
        "IfNoneMatch": {
            "name": "If-None-Match",
            "in": "header",
            "description": "ETags of a cached copy: a match answers `304`.",
            "schema": { "type": "string" },
        },
    })
}

// Schemas

/// Whether the tool accepts `{}`, what absent `arguments` mean.
pub(super) fn accepts_empty(tool: &CatalogTool) -> bool {
    tool.validator()
        .is_ok_and(|validator| validator.is_valid(&json!({})))
}

pub(super) fn common_schemas() -> Map<String, Value> {
    let schemas = json!({
        "ContentHash": { "type": "string", "pattern": "^[0-9a-f]{64}$" },
        "ExecutionId": {
            "type": "string",
            "pattern": "^exec_[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
        },
        "RequestId": {
            "description": "1–256 bytes of printable ASCII.",
            "type": "string",
            "pattern": "^[ -~]{1,256}$",
        },
        "IdempotencyKey": {
            "description": "A request id as a header value: HTTP trims spaces at either end.",
            "type": "string",
            "pattern": "^[!-~]([ -~]{0,254}[!-~])?$",
        },
        "UInt64": { "type": "integer", "minimum": 0, "maximum": u64::MAX },
        "ExecutionResponse": {
            "type": "object",
            "required": ["execution_id", "status", "data", "_agent"],
            "properties": {
                "execution_id": { "$ref": "#/components/schemas/ExecutionId" },
                "status": { "const": "completed" },
                "data": {},
                "_agent": { "$ref": "#/components/schemas/Agent" },
            },
        },
        "RunningExecution": {
            "type": "object",
            "required": ["execution_id", "tool", "status", "created_at"],
            "properties": {
                "execution_id": { "$ref": "#/components/schemas/ExecutionId" },
                "tool": { "type": "string" },
                "status": { "const": "running" },
                "progress": { "type": "object" },
                "created_at": { "type": "string", "format": "date-time" },
            },
        },
        "ExecutionList": {
            "type": "object",
            "required": ["executions", "next_cursor"],
            "properties": {
                "executions": { "type": "array", "items": {
                    "type": "object",
                    "required": ["execution_id", "tool", "status", "created_at"],
                    "properties": {
                        "execution_id": { "$ref": "#/components/schemas/ExecutionId" },
                        "tool": { "type": "string" },
                        "status": { "$ref": "#/components/schemas/ExecutionStatus" },
                        "created_at": { "type": "string", "format": "date-time" },
                    },
                } },
                "next_cursor": { "type": ["string", "null"] },
            },
        },
        "ExecutionStatus": {
            "enum": ["running", "completed", "failed", "cancelled", "timed_out"],
        },
        "ErrorResponse": {
            "description": "A failed execution, or (`error` alone) a request refused before an \
                            execution existed.",
            "type": "object",
            "required": ["error"],
            "properties": {
                "execution_id": { "$ref": "#/components/schemas/ExecutionId" },
                "status": { "enum": ["failed", "cancelled", "timed_out"] },
                "error": { "$ref": "#/components/schemas/Error" },
                "_agent": { "$ref": "#/components/schemas/Agent" },
            },
        },
        "Error": {
            "type": "object",
            "required": ["code", "message", "category", "recoverable", "retryable"],
            "properties": {
                "code": { "type": "string" },
                "message": { "type": "string" },
                "category": { "enum": [
                    "validation", "permission", "not_found", "conflict",
                    "cancelled", "internal", "capacity", "timeout",
                ] },
                "recoverable": { "type": "boolean" },
                "retryable": { "type": "boolean" },
                "retry_after": { "$ref": "#/components/schemas/UInt64" },
                "suggested_action": { "type": "string" },
                "details": {},
            },
        },
        "Agent": {
            "type": "object",
            "required": ["cacheable", "next_actions"],
            "properties": {
                "cacheable": { "type": "boolean" },
                "next_actions": {
                    "type": "array",
                    "items": { "$ref": "#/components/schemas/NextAction" },
                },
            },
        },
        "NextAction": {
            "type": "object",
            "required": ["tool", "reason"],
            "properties": {
                "tool": { "type": "string" },
                "arguments": { "type": "object" },
                "reason": { "type": "string" },
                "after_ms": { "$ref": "#/components/schemas/UInt64" },
            },
        },
        "CatalogEntry": {
            "type": "object",
            "required": ["name", "description", "input_schema", "output_schema", "effect",
                         "idempotent", "parallel_safe", "confirmation"],
            "properties": {
                "name": { "type": "string" },
                "description": { "type": "string" },
                "input_schema": { "type": "object" },
                "output_schema": {},
                "effect": { "enum": ["none", "read", "write", "external_write", "destructive"] },
                "idempotent": { "type": "boolean" },
                "parallel_safe": { "type": "boolean" },
                "confirmation": { "enum": ["none", "required"] },
                "timeout_ms": { "$ref": "#/components/schemas/UInt64" },
            },
        },
        "HealthReport": {
            "type": "object",
            "required": ["status", "state", "since", "checks"],
            "properties": {
                "status": { "enum": ["pass", "warn", "fail"] },
                "state": { "$ref": "#/components/schemas/HealthState" },
                "since": { "type": "string", "format": "date-time" },
                "reason": { "type": "string" },
                "checks": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "required": ["status"],
                        "properties": {
                            "status": { "enum": ["pass", "warn", "fail"] },
                            "observed_ms": { "$ref": "#/components/schemas/UInt64" },
                            "output": { "type": "string" },
                        },
                    },
                },
            },
        },
        "HealthState": { "enum": ["healthy", "degrading", "degraded"] },
    });
    match schemas {
        Value::Object(schemas) => schemas,
        _ => unreachable!("a JSON object literal"),
    }
}
