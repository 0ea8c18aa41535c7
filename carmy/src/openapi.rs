//! The OpenAPI 3.1 document of one trust level (`protocol.md` §11), generated from the catalog
//! and the schemas the tools' types already derive: no second schema source. It describes
//! carmy/1 precisely enough for a fuzzer: every status carmy can answer, with its body.
//!
//! The document is a list of path groups; an endpoint group adds one function to
//! [`PATH_GROUPS`]. Serving it (ETag, `304`) is the HTTP adapter's business.

use serde_json::{Map, Value, json};

use crate::catalog::{Catalog, CatalogTool};
use crate::executions::MAX_PAGE;
use crate::principal::TrustLevel;
use crate::wire::paths;
use crate::wire::subscriptions::{
    DEFAULT_PAGE as SUBSCRIPTIONS_PAGE, MAX_DESCRIPTION_BYTES, MAX_PAGE as SUBSCRIPTIONS_MAX_PAGE,
    MAX_URL_BYTES,
};

const OPENAPI_VERSION: &str = "3.1.0";

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
struct Builder<'a> {
    scope: &'a Scope<'a>,
    catalog: &'a Catalog,
    paths: Map<String, Value>,
    /// `components.schemas`: the shared shapes, and the definitions of recursive tool types.
    schemas: Map<String, Value>,
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

// Path groups

fn discovery_paths(builder: &mut Builder<'_>) {
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

fn catalog_paths(builder: &mut Builder<'_>) {
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

fn openapi_paths(builder: &mut Builder<'_>) {
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

/// `POST /agent/execute`. Its `Idempotency-Key` header is left undocumented here: it must
/// equal the body's `request_id` when both are sent, which no schema can say; the per-tool
/// operations take it.
fn execute_paths(builder: &mut Builder<'_>) {
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
fn tool_paths(builder: &mut Builder<'_>) {
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

/// `/agent/executions` (§9): the caller's executions, read back, followed, cancelled, listed.
fn executions_paths(builder: &mut Builder<'_>) {
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

fn health_paths(builder: &mut Builder<'_>) {
    let scope = builder.scope;
    let report = json!({
        "description": "The health report; `503` while the service is degraded.",
        "headers": { "Cache-Control": { "$ref": "#/components/headers/NoStore" } },
        "content": { "application/health+json": {
            "schema": { "$ref": "#/components/schemas/HealthReport" },
        } },
    });
    let mut responses = json!({ "200": report, "503": report });
    add_errors(&mut responses, scope, PROBE_ERRORS);
    builder.paths.insert(
        paths::HEALTH.to_owned(),
        json!({ "get": {
            "operationId": "health",
            "summary": "The service's health: its state machine and component checks.",
            "tags": ["carmy"],
            "responses": responses,
        } }),
    );

    let text = |description: &str| {
        json!({
            "description": description,
            "headers": { "Cache-Control": { "$ref": "#/components/headers/NoStore" } },
            "content": { "text/plain": { "schema": { "type": "string" } } },
        })
    };
    let mut responses = json!({ "200": text("The process serves.") });
    add_errors(&mut responses, scope, PROBE_ERRORS);
    builder.paths.insert(
        paths::LIVE.to_owned(),
        json!({ "get": {
            "operationId": "health_live",
            "summary": "Liveness: answers while the process serves.",
            "tags": ["carmy"],
            "responses": responses,
        } }),
    );

    let mut responses = json!({
        "200": text("Ready for traffic: `ok`, or one line per check with `verbose`."),
        "503": text("Not ready: shutting down, degraded, or a required check fails."),
    });
    add_errors(&mut responses, scope, PROBE_ERRORS);
    builder.paths.insert(
        paths::READY.to_owned(),
        json!({ "get": {
            "operationId": "health_ready",
            "summary": "Readiness: whether the service should receive traffic.",
            "tags": ["carmy"],
            "parameters": [{
                "name": "verbose",
                "in": "query",
                "description": "List each check as `[+]name ok` or `[-]name failed`.",
                "allowEmptyValue": true,
                "schema": { "type": "string" },
            }],
            "responses": responses,
        } }),
    );
}

/// `POST /agent/admin/reload`, for `internal` callers (and holders of `manage:config`, who are
/// served the document of their trust level and so do not see it).
fn admin_paths(builder: &mut Builder<'_>) {
    let scope = builder.scope;
    if scope.trust != TrustLevel::Internal {
        return;
    }
    let mut responses = json!({ "200": {
        "description": "The file was read: applied, or unchanged (a no-op).",
        "headers": { "Cache-Control": { "$ref": "#/components/headers/NoStore" } },
        "content": { "application/json": { "schema": {
            "type": "object",
            "required": ["result", "tools_changed"],
            "properties": {
                "result": { "enum": ["applied", "unchanged"] },
                "tools_changed": { "type": "boolean" },
            },
        } } },
    } });
    add_errors(&mut responses, scope, ADMIN_ERRORS);
    builder.paths.insert(
        paths::ADMIN_RELOAD.to_owned(),
        json!({ "post": {
            "operationId": "admin_reload",
            "summary": "Reload `carmy.toml` now; a file that fails is refused whole (`409`).",
            "tags": ["carmy"],
            "responses": responses,
        } }),
    );
}

/// `/agent/events/subscriptions` (§8): documented for internal callers while events are on
/// (holders of `manage:events` below `internal` use them too, undocumented in their document).
fn subscription_paths(builder: &mut Builder<'_>) {
    let scope = builder.scope;
    if scope.trust != TrustLevel::Internal || !scope.events {
        return;
    }
    let event_types = json!({ "type": "array", "minItems": 1, "items": { "enum": [
        "execution.finished", "health.changed", "tools.changed", "subscription.disabled",
    ] } });
    let subscription = json!({
        "type": "object",
        "required": ["id", "url", "event_types", "status", "source"],
        "properties": {
            "id": { "type": "string", "pattern": "^sub_" },
            "url": { "type": "string" },
            "event_types": event_types,
            "status": { "enum": ["enabled", "disabled"] },
            "source": { "enum": ["api", "config"] },
            "description": { "type": "string" },
            "created_at": { "type": "string", "format": "date-time" },
            "disabled_reason": { "type": "string" },
        },
    });
    let mut with_secret = subscription.clone();
    if let Some(required) = with_secret["required"].as_array_mut() {
        required.push(json!("secret"));
    }
    with_secret["properties"]["secret"] = json!({ "type": "string", "pattern": "^whsec_" });
    builder
        .schemas
        .insert("Subscription".to_owned(), subscription);
    builder
        .schemas
        .insert("SubscriptionWithSecret".to_owned(), with_secret);
    let no_store = json!({ "$ref": "#/components/headers/NoStore" });
    let answer = |status: &str, description: &str, schema: Value, errors: &[u16]| {
        let mut responses = json!({ status: {
            "description": description,
            "headers": { "Cache-Control": no_store },
            "content": { "application/json": { "schema": schema } },
        } });
        add_errors(&mut responses, scope, errors);
        responses
    };
    let reference = |name: &str| json!({ "$ref": format!("#/components/schemas/{name}") });
    let json_body = |schema: Value| json!({ "required": true, "content": { "application/json": { "schema": schema } } });
    let id =
        json!([{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }]);
    let operation = |operation_id: &str, summary: &str, responses: Value| json!({ "operationId": operation_id, "summary": summary, "tags": ["carmy"], "responses": responses });

    let mut create = operation(
        "create_subscription",
        "Subscribe a URL to event types; the secret is shown once. Nothing is sent to the URL.",
        answer(
            "201",
            "Created.",
            reference("SubscriptionWithSecret"),
            SUBSCRIPTION_WRITE_ERRORS,
        ),
    );
    let url = json!({ "type": "string", "description": format!("At most {MAX_URL_BYTES} bytes.") });
    let description = format!("At most {MAX_DESCRIPTION_BYTES} bytes.");
    create["requestBody"] = json_body(json!({
        "type": "object",
        "required": ["url", "event_types"],
        "additionalProperties": false,
        "properties": {
            "url": url,
            "event_types": event_types,
            "description": { "type": "string", "description": description },
        },
    }));
    let list = json!({ "type": "object", "required": ["subscriptions", "next_cursor"], "properties": {
        "subscriptions": { "type": "array", "items": reference("Subscription") },
        "next_cursor": { "type": ["string", "null"] },
    } });
    let mut listed = operation(
        "list_subscriptions",
        "A page of the subscriptions, without secrets: those declared in the file, then the \
         others oldest first.",
        answer(
            "200",
            "The subscriptions; `next_cursor` is null on the last page.",
            list,
            SUBSCRIPTION_READ_ERRORS,
        ),
    );
    let query = |name: &str, description: &str, schema: Value| json!({ "name": name, "in": "query", "description": description, "schema": schema });
    listed["parameters"] = json!([
        query(
            "limit",
            &format!("At most this many (default {SUBSCRIPTIONS_PAGE})."),
            json!({ "type": "integer", "minimum": 1, "maximum": SUBSCRIPTIONS_MAX_PAGE })
        ),
        query(
            "cursor",
            "The `next_cursor` of the previous page.",
            json!({ "type": "string", "pattern": "^sub_[A-Za-z0-9_]{1,60}$" })
        ),
    ]);
    builder.paths.insert(
        paths::SUBSCRIPTIONS.to_owned(),
        json!({ "get": listed, "post": create }),
    );

    let mut update = operation(
        "update_subscription",
        "Re-enable or disable a subscription, or change its event types or description.",
        answer(
            "200",
            "Updated.",
            reference("Subscription"),
            SUBSCRIPTION_ONE_ERRORS,
        ),
    );
    update["requestBody"] = json_body(json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "enabled": { "type": "boolean" },
            "event_types": event_types,
            "description": { "type": ["string", "null"], "description": description },
        },
    }));
    let mut deleted = json!({ "204": { "description": "Deleted, with its pending deliveries." } });
    add_errors(&mut deleted, scope, SUBSCRIPTION_ONE_ERRORS);
    builder.paths.insert(
        format!("{}/{{id}}", paths::SUBSCRIPTIONS),
        json!({
            "parameters": id,
            "get": operation(
                "get_subscription",
                "One subscription, without its secret.",
                answer("200", "The subscription.", reference("Subscription"), SUBSCRIPTION_ONE_ERRORS),
            ),
            "patch": update,
            "delete": operation("delete_subscription", "Delete a subscription.", deleted),
        }),
    );
    builder.paths.insert(
        format!("{}/{{id}}/rotate-secret", paths::SUBSCRIPTIONS),
        json!({
            "parameters": id,
            "post": operation(
                "rotate_subscription_secret",
                "A new secret, shown once; the old one signs alongside it for 24 hours.",
                answer("200", "Rotated.", reference("SubscriptionWithSecret"), SUBSCRIPTION_ONE_ERRORS),
            ),
        }),
    );
    let attempts = json!({ "type": "object", "required": ["deliveries"], "properties": {
        "deliveries": { "type": "array", "items": {
            "type": "object",
            "required": ["event_id", "at", "status_code", "duration_ms", "error"],
            "properties": {
                "event_id": { "type": "string", "pattern": "^evt_" },
                "at": { "type": "string", "format": "date-time" },
                "status_code": { "type": ["integer", "null"] },
                "duration_ms": { "type": "integer", "minimum": 0 },
                "error": { "type": ["string", "null"] },
            },
        } },
    } });
    builder.paths.insert(
        format!("{}/{{id}}/deliveries", paths::SUBSCRIPTIONS),
        json!({
            "parameters": id,
            "get": operation(
                "list_subscription_deliveries",
                "The latest 100 delivery attempts, newest first.",
                answer("200", "The attempts.", attempts, SUBSCRIPTION_ONE_ERRORS),
            ),
        }),
    );
}

// Operations and responses

/// A document served from memory: `200` with a strong `ETag`, `304` for a matching
/// `If-None-Match`. `HEAD` answers the same without a body.
fn document_operation(scope: &Scope<'_>, id: &str, summary: &str, schema: &Value) -> Value {
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

/// The `200` of an execution: JSON (`success`), or the event stream when asked for.
fn execution_responses(success: &Value) -> Value {
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

/// Every status an error can be answered with, and when. Statuses outside a group's list
/// cannot come from that group's routes.
const ERROR_STATUSES: &[(u16, &str)] = &[
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
const DOCUMENT_ERRORS: &[u16] = &[400, 406, 429, 503];
/// Probes spend no rate-limit budget.
const PROBE_ERRORS: &[u16] = &[400, 406];
/// A body (it must be empty), a browser's foreign origin, a refused file (`409`), a budget.
const ADMIN_ERRORS: &[u16] = &[400, 403, 406, 409, 429];
const SUBSCRIPTION_READ_ERRORS: &[u16] = &[400, 406, 429, 503];
/// A bad or long field, a browser's foreign origin, too many subscriptions (`409`), the body,
/// a budget, the store.
const SUBSCRIPTION_WRITE_ERRORS: &[u16] = &[400, 403, 406, 409, 413, 429, 503];
const SUBSCRIPTION_ONE_ERRORS: &[u16] = &[400, 403, 404, 406, 409, 413, 429, 503];
/// A bad parameter, a budget, the store.
const EXECUTION_LIST_ERRORS: &[u16] = &[400, 406, 429, 503];
/// A malformed `Carmy-Version`, no such execution, a budget, the store: never the outcome's.
const EXECUTION_READ_ERRORS: &[u16] = &[400, 404, 406, 429, 503];
/// A duplicated header, a browser's foreign origin, no such execution, one that has ended, a
/// budget, the store.
const EXECUTION_CANCEL_ERRORS: &[u16] = &[400, 403, 404, 406, 409, 429, 503];
/// A bad `Last-Event-ID`, no such execution, a budget, the store.
const EXECUTION_EVENTS_ERRORS: &[u16] = &[400, 404, 406, 429, 503];
const EXECUTION_ERRORS: &[u16] = &[400, 403, 404, 406, 408, 409, 413, 429, 500, 503, 504];

/// Adds the error responses `statuses`, and `401` where credentials are checked.
fn add_errors(responses: &mut Value, scope: &Scope<'_>, statuses: &[u16]) {
    let unauthorized = scope.bearer.then_some(401);
    for status in statuses.iter().copied().chain(unauthorized) {
        responses[status.to_string()] =
            json!({ "$ref": format!("#/components/responses/Error{status}") });
    }
}

/// `components.responses`: one per error status, each with the error envelope.
fn error_responses() -> Value {
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

fn common_headers() -> Value {
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

fn common_parameters() -> Value {
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
fn accepts_empty(tool: &CatalogTool) -> bool {
    tool.validator()
        .is_ok_and(|validator| validator.is_valid(&json!({})))
}

fn common_schemas() -> Map<String, Value> {
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

/// The events carmy delivers (`protocol.md` §8): a signed `POST` of `{type, timestamp, data}`.
fn webhooks() -> Value {
    let events = [
        (
            "health.changed",
            "The service's health state machine moved.",
            json!({
                "type": "object",
                "required": ["from", "to", "since"],
                "properties": {
                    "from": { "$ref": "#/components/schemas/HealthState" },
                    "to": { "$ref": "#/components/schemas/HealthState" },
                    "reason": { "type": ["string", "null"] },
                    "since": { "type": "string", "format": "date-time" },
                },
            }),
        ),
        (
            "tools.changed",
            "A reload changed the catalog.",
            json!({
                "type": "object",
                "required": ["tools_version"],
                "properties": { "tools_version": { "$ref": "#/components/schemas/ContentHash" } },
            }),
        ),
        (
            "execution.finished",
            "An async execution, or one with a request id, finished.",
            json!({
                "type": "object",
                "required": ["execution_id", "tool", "status", "caller"],
                "properties": {
                    "execution_id": { "$ref": "#/components/schemas/ExecutionId" },
                    "tool": { "type": "string" },
                    "status": { "enum": ["completed", "failed", "cancelled", "timed_out"] },
                    "caller": { "type": "string" },
                },
            }),
        ),
        (
            "subscription.disabled",
            "A subscription failed continuously and was disabled.",
            json!({
                "type": "object",
                "required": ["id", "url"],
                "properties": {
                    "id": { "type": "string", "pattern": "^sub_" },
                    "url": { "type": "string", "format": "uri" },
                    "reason": { "type": "string" },
                },
            }),
        ),
    ];
    let signature_headers = json!([
        { "name": "webhook-id", "in": "header", "required": true,
          "description": "The event's id, the same on every retry: the deduplication key.",
          "schema": { "type": "string", "pattern": "^evt_" } },
        { "name": "webhook-timestamp", "in": "header", "required": true,
          "description": "Unix seconds of this attempt.",
          "schema": { "type": "string", "pattern": "^[0-9]+$" } },
        { "name": "webhook-signature", "in": "header", "required": true,
          "description": "`v1,<base64 HMAC-SHA256 of \"{id}.{timestamp}.{body}\">`, several \
                          space-separated while a secret rotates (Standard Webhooks).",
          "schema": { "type": "string" } },
    ]);
    let webhooks: Map<String, Value> = events
        .into_iter()
        .map(|(name, summary, data)| {
            let body = json!({
                "type": "object",
                "required": ["type", "timestamp", "data"],
                "properties": {
                    "type": { "const": name },
                    "timestamp": { "type": "string", "format": "date-time" },
                    "data": data,
                },
            });
            let operation = json!({ "post": {
                "operationId": name,
                "summary": summary,
                "parameters": signature_headers,
                "requestBody": { "required": true, "content": { "application/json": { "schema": body } } },
                "responses": {
                    "2XX": { "description": "Delivered." },
                    "410": { "description": "Disables the subscription." },
                },
            } });
            (name.to_owned(), operation)
        })
        .collect();
    Value::Object(webhooks)
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
    use super::ERROR_STATUSES;
    use crate::http::error::status_for;
    use crate::tool_error::Category;
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
