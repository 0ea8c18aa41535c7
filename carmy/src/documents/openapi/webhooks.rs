//! `webhooks`: the events carmy delivers (`protocol.md` §8).

use serde_json::{Map, Value, json};

/// The events carmy delivers (`protocol.md` §8): a signed `POST` of `{type, timestamp, data}`.
pub(super) fn webhooks() -> Value {
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
