//! The execution response body of `protocol.md` §4, serialized once per execution.

use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;

use super::ExecutionStatus;
use crate::tool_error::ToolError;
use crate::wire::codes;

/// A failed execution's body; a completed one is written by [`completed`].
#[derive(Serialize)]
struct Body<'a> {
    execution_id: &'a str,
    #[serde(serialize_with = "status_name")]
    status: ExecutionStatus,
    error: &'a ToolError,
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
    tool: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    arguments: Option<&'a Value>,
    reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    after_ms: Option<u64>,
}

/// Arguments larger than this (serialized) are not repeated in a suggestion: the agent has them,
/// and an error body stays small.
const MAX_ECHOED_ARGUMENTS: usize = 8 * 1024;

/// `arguments`, when they are an arguments object (a suggestion is a call to make, and the
/// confirmation gate runs before the arguments are validated) small enough to repeat.
fn echoed(arguments: &Value) -> Option<&Value> {
    if !arguments.is_object() {
        return None;
    }
    /// Counts bytes instead of keeping them.
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            if self.0 > MAX_ECHOED_ARGUMENTS {
                return Err(std::io::ErrorKind::FileTooLarge.into());
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    serde_json::to_writer(Counter(0), arguments)
        .ok()
        .map(|()| arguments)
}

/// What to suggest after a call refused before it ran.
pub(crate) fn after_rejection<'a>(
    error: &ToolError,
    tool: &'a str,
    arguments: &'a Value,
) -> Vec<NextAction<'a>> {
    match error.code() {
        codes::CONFIRMATION_REQUIRED => vec![NextAction {
            tool,
            arguments: echoed(arguments),
            reason: format!(
                "needs the user's confirmation: ask the user, and call again once the host has \
                 granted `confirm:{tool}`"
            ),
            after_ms: None,
        }],
        _ => Vec::new(),
    }
}

/// What to suggest after a call of `tool` failed: a retry when the same call may succeed later,
/// and the tool the error suggests.
pub(crate) fn after_failure<'a>(
    error: &'a ToolError,
    tool: &'a str,
    arguments: &'a Value,
    with_request_id: bool,
) -> Vec<NextAction<'a>> {
    let mut next_actions = Vec::new();
    if error.is_retryable() {
        next_actions.push(NextAction {
            tool,
            arguments: echoed(arguments),
            reason: if with_request_id {
                "the same call may succeed later: retry it with the same request_id".to_owned()
            } else {
                "the same call may succeed later: retry it".to_owned()
            },
            after_ms: error
                .retry_after()
                .map(|after| u64::try_from(after.as_millis()).unwrap_or(u64::MAX)),
        });
    }
    if let Some(suggested) = error.suggested_action() {
        next_actions.push(NextAction {
            tool: suggested,
            arguments: None,
            reason: format!("suggested after `{}`: {}", error.code(), error.message()),
            after_ms: None,
        });
    }
    next_actions
}

fn status_name<S: serde::Serializer>(
    status: &ExecutionStatus,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(status.as_str())
}

/// A completed execution's body: the `Body` serde would write, written directly (this is every
/// successful call's answer, and serde's field-by-field escaping was a tenth of a call).
///
/// `data` is the tool's output, JSON. The buffer is sized to the body exactly when the id needs
/// no escaping (carmy's ids never do), so that it becomes `Bytes` without another allocation.
pub(crate) fn completed(execution_id: &str, data: &str, cacheable: bool) -> Bytes {
    const HEAD: &[u8] = b"{\"execution_id\":";
    const MIDDLE: &[u8] = b",\"status\":\"completed\",\"data\":";
    let tail: &[u8] = if cacheable {
        b",\"_agent\":{\"cacheable\":true,\"next_actions\":[]}}"
    } else {
        b",\"_agent\":{\"cacheable\":false,\"next_actions\":[]}}"
    };
    let quoted_id = execution_id.len() + 2;
    let mut bytes =
        Vec::with_capacity(HEAD.len() + quoted_id + MIDDLE.len() + data.len() + tail.len());
    bytes.extend_from_slice(HEAD);
    if needs_escaping(execution_id) {
        serde_json::to_writer(&mut bytes, execution_id).expect("a string serializes");
    } else {
        bytes.push(b'"');
        bytes.extend_from_slice(execution_id.as_bytes());
        bytes.push(b'"');
    }
    bytes.extend_from_slice(MIDDLE);
    bytes.extend_from_slice(data.as_bytes());
    bytes.extend_from_slice(tail);
    Bytes::from(bytes)
}

/// Whether `text` holds a character a JSON string must escape. Every byte is looked at, with
/// no early exit, so the check runs a vector at a time: cheaper than serde's byte-by-byte scan
/// for an id that never needs escaping.
fn needs_escaping(text: &str) -> bool {
    text.bytes().fold(false, |escape, byte| {
        escape | (byte == b'"') | (byte == b'\\') | (byte < 0x20)
    })
}

/// A failed, cancelled or timed-out execution's body.
pub(crate) fn failed(
    execution_id: &str,
    status: ExecutionStatus,
    error: &ToolError,
    next_actions: &[NextAction<'_>],
) -> Bytes {
    serialize(
        ERROR_BYTES,
        &Body {
            execution_id,
            status,
            error,
            agent: Agent {
                cacheable: false,
                next_actions,
            },
        },
    )
}

/// A failed body, most of the time: the envelope and an error with a short message.
const ERROR_BYTES: usize = 512;

/// `capacity`: the expected length, so the buffer is allocated once.
fn serialize(capacity: usize, body: &Body<'_>) -> Bytes {
    let mut bytes = Vec::with_capacity(capacity);
    // Every part is plain data (strings, numbers, JSON values): serializing cannot fail.
    serde_json::to_writer(&mut bytes, body).expect("execution bodies serialize");
    Bytes::from(bytes)
}

/// The body with `"replayed": …` added, as the last SSE event carries it.
pub(crate) fn with_replayed(body: &[u8], replayed: bool) -> String {
    let body = String::from_utf8_lossy(body);
    let open = body.strip_suffix('}').unwrap_or(&body);
    let replayed = if replayed { "true" } else { "false" };
    // Sized once: this is every streamed answer's last event.
    let mut data = String::with_capacity(open.len() + ",\"replayed\":false}".len());
    data.push_str(open);
    data.push_str(",\"replayed\":");
    data.push_str(replayed);
    data.push('}');
    data
}

/// `tool.progress` data, fields in the protocol's order.
#[derive(Serialize)]
struct ProgressData<'a> {
    execution_id: &'a str,
    progress: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

/// The data of a `tool.progress` event, as streamed and as kept for re-attachment.
pub(crate) fn progress_data(execution_id: &str, progress: &crate::context::Progress) -> Bytes {
    let data = ProgressData {
        execution_id,
        progress: progress.progress,
        total: progress.total,
        message: progress.message.as_deref(),
    };
    Bytes::from(serde_json::to_vec(&data).expect("progress serializes"))
}

/// `execution.started` data, fields in the protocol's order.
#[derive(Serialize)]
struct StartedData<'a> {
    execution_id: &'a str,
    tool: &'a str,
}

/// The data of `execution.started`: serialized straight from its fields, not through a
/// `serde_json::Value` (every streamed call sends one).
pub(crate) fn started_data(execution_id: &str, tool: &str) -> String {
    serde_json::to_string(&StartedData { execution_id, tool }).expect("started data serializes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_events_data_is_the_protocols() {
        assert_eq!(
            started_data("exec_1", "create_order"),
            r#"{"execution_id":"exec_1","tool":"create_order"}"#
        );
        let odd: Value = serde_json::from_str(&started_data("exec_\"\n", "t\\")).unwrap();
        assert_eq!(odd["execution_id"], "exec_\"\n");
        assert_eq!(odd["tool"], "t\\");
        assert_eq!(
            with_replayed(br#"{"execution_id":"exec_1","status":"completed"}"#, true),
            r#"{"execution_id":"exec_1","status":"completed","replayed":true}"#
        );
        assert_eq!(
            with_replayed(br#"{"status":"failed"}"#, false),
            r#"{"status":"failed","replayed":false}"#
        );
    }

    #[test]
    fn a_completed_body_is_the_protocols_with_its_fields_in_order() {
        let data = r#"{"order_id":1,"note":"é\"x"}"#;
        assert_eq!(
            std::str::from_utf8(&completed("exec_1", data, false)).unwrap(),
            r#"{"execution_id":"exec_1","status":"completed","data":{"order_id":1,"note":"é\"x"},"_agent":{"cacheable":false,"next_actions":[]}}"#
        );
        for odd_id in [
            "exec_\"",
            "exec_\\",
            "exec_\n",
            "exec_\u{1f}",
            "exec_\"\\\n",
        ] {
            let body: Value = serde_json::from_slice(&completed(odd_id, data, true)).unwrap();
            assert_eq!(body["execution_id"], odd_id);
            assert_eq!(body["_agent"]["cacheable"], true);
            assert_eq!(body["data"]["note"], "é\"x");
        }
    }
}
