//! The execution response body of `protocol.md` §4, serialized once per execution.

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::idempotency::ExecutionStatus;
use crate::tool_error::ToolError;

#[derive(Serialize)]
struct Body<'a> {
    execution_id: &'a str,
    #[serde(serialize_with = "status_name")]
    status: ExecutionStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a ToolError>,
    #[serde(rename = "_agent")]
    agent: Agent<'a>,
}

#[derive(Serialize)]
struct Agent<'a> {
    cacheable: bool,
    next_actions: &'a [NextAction<'a>],
}

/// A suggestion for the agent's next call.
#[derive(Serialize)]
pub(crate) struct NextAction<'a> {
    pub(crate) tool: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) arguments: Option<&'a Value>,
    pub(crate) reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) after_ms: Option<u64>,
}

fn status_name<S: serde::Serializer>(
    status: &ExecutionStatus,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(status.as_str())
}

/// A completed execution's body.
pub(crate) fn completed(execution_id: &str, data: &RawValue, cacheable: bool) -> Bytes {
    serialize(&Body {
        execution_id,
        status: ExecutionStatus::Completed,
        data: Some(data),
        error: None,
        agent: Agent {
            cacheable,
            next_actions: &[],
        },
    })
}

/// A failed, cancelled or timed-out execution's body.
pub(crate) fn failed(
    execution_id: &str,
    status: ExecutionStatus,
    error: &ToolError,
    next_actions: &[NextAction<'_>],
) -> Bytes {
    serialize(&Body {
        execution_id,
        status,
        data: None,
        error: Some(error),
        agent: Agent {
            cacheable: false,
            next_actions,
        },
    })
}

fn serialize(body: &Body<'_>) -> Bytes {
    // Every part is plain data (strings, numbers, JSON values): serializing cannot fail.
    Bytes::from(serde_json::to_vec(body).expect("execution bodies serialize"))
}

/// The body with `"replayed": …` added, as the last SSE event carries it.
pub(crate) fn with_replayed(body: &[u8], replayed: bool) -> String {
    let body = String::from_utf8_lossy(body);
    let open = body.strip_suffix('}').unwrap_or(&body);
    format!("{open},\"replayed\":{replayed}}}")
}
