//! What operators use: health and readiness, the configuration reload, event subscriptions.

use serde_json::{Value, json};

use super::Builder;
use super::components::{
    ADMIN_ERRORS, PROBE_ERRORS, SUBSCRIPTION_ONE_ERRORS, SUBSCRIPTION_READ_ERRORS,
    SUBSCRIPTION_WRITE_ERRORS, add_errors,
};
use crate::principal::TrustLevel;
use crate::wire::paths;
use crate::wire::subscriptions::{
    DEFAULT_PAGE as SUBSCRIPTIONS_PAGE, MAX_DESCRIPTION_BYTES, MAX_PAGE as SUBSCRIPTIONS_MAX_PAGE,
    MAX_URL_BYTES,
};

pub(super) fn health_paths(builder: &mut Builder<'_>) {
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
pub(super) fn admin_paths(builder: &mut Builder<'_>) {
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
pub(super) fn subscription_paths(builder: &mut Builder<'_>) {
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
