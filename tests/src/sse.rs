//! Server-Sent Events, read back.

use serde_json::Value;

/// One Server-Sent Event, or a comment (a keep-alive).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub id: Option<String>,
    pub data: Option<String>,
    pub comment: bool,
}

impl SseEvent {
    /// The data as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().expect("event has data")).expect("data is JSON")
    }
}

/// Splits an event-stream body into its events and comments.
pub fn parse_sse(text: &str) -> Vec<SseEvent> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut event = SseEvent {
                event: None,
                id: None,
                data: None,
                comment: false,
            };
            for line in block.lines() {
                if line.starts_with(':') {
                    event.comment = true;
                } else if let Some((field, value)) = line.split_once(':') {
                    let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
                    match field {
                        "event" => event.event = Some(value),
                        "id" => event.id = Some(value),
                        "data" => {
                            assert!(event.data.is_none(), "data must fit on one line: {block}");
                            event.data = Some(value);
                        }
                        other => panic!("unexpected SSE field {other:?} in {block:?}"),
                    }
                }
            }
            event
        })
        .collect()
}
