//! Server-Sent Events as carmy sends them (`protocol.md` §4, §9): `event:`, `id:`, one `data:`
//! line. Each event is framed into one buffer sized for it (axum's `Event` builder grows its
//! buffer field by field: about 2,800 instructions an event, when a whole synchronous call is
//! 50,000), so that a call whose events are all known when it is answered goes out as one body,
//! without a stream or a keep-alive timer.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::Body;
use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::Response;
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use crate::wire::NO_STORE;

static EVENT_STREAM: HeaderValue = HeaderValue::from_static("text/event-stream");

/// Sent while a stream is quiet: a comment, which clients skip, keeps proxies from closing it.
const KEEP_ALIVE: Bytes = Bytes::from_static(b":\n\n");

/// Appends one event to `frames`. Data is one line of JSON; any line break in it would still
/// start a new `data:` line, as the format requires.
pub(crate) fn append(frames: &mut Vec<u8>, name: &str, id: u64, data: &[u8]) {
    const FIELDS: usize = "event: \nid: \ndata: \n\n".len();
    let mut id_text = itoa::Buffer::new();
    let id = id_text.format(id).as_bytes();
    frames.reserve(FIELDS + name.len() + id.len() + data.len());
    frames.extend_from_slice(b"event: ");
    frames.extend_from_slice(name.as_bytes());
    frames.extend_from_slice(b"\nid: ");
    frames.extend_from_slice(id);
    for line in data.split(|&byte| byte == b'\n' || byte == b'\r') {
        frames.extend_from_slice(b"\ndata: ");
        frames.extend_from_slice(line);
    }
    frames.extend_from_slice(b"\n\n");
}

/// One event as a frame of its own.
pub(crate) fn frame(name: &str, id: u64, data: &[u8]) -> Bytes {
    let mut frame = Vec::new();
    append(&mut frame, name, id, data);
    Bytes::from(frame)
}

/// A `text/event-stream` answer, `Cache-Control: no-store`.
pub(crate) fn response(body: Body) -> Response {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.reserve(super::RESPONSE_HEADERS);
    headers.insert(CONTENT_TYPE, EVENT_STREAM.clone());
    headers.insert(CACHE_CONTROL, NO_STORE.clone());
    response
}

/// A body that sends `frames` as they come and a keep-alive comment whenever none came for
/// `keep_alive`.
pub(crate) fn streamed<S>(frames: S, keep_alive: Duration) -> Body
where
    S: Stream<Item = Bytes> + Send + 'static,
{
    let frames = futures_util::stream::unfold(Box::pin(frames), move |mut frames| async move {
        let frame = tokio::select! {
            biased;
            frame = frames.next() => frame?,
            () = tokio::time::sleep(keep_alive) => KEEP_ALIVE,
        };
        Some((Ok::<_, Infallible>(frame), frames))
    });
    Body::from_stream(frames)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use axum::response::sse::{Event, Sse};
    use http_body_util::BodyExt;

    async fn bytes_of(body: Body) -> Bytes {
        body.collect().await.unwrap().to_bytes()
    }

    /// The frames are byte for byte what axum's `Sse` writes for the same event.
    #[tokio::test]
    async fn an_event_is_framed_as_axum_frames_it() {
        let data = r#"{"execution_id":"exec_1","tool":"create_order"}"#;
        let mut frames = Vec::new();
        append(&mut frames, "execution.started", 1, data.as_bytes());
        append(&mut frames, "execution.completed", 12, b"{}");
        let events = futures_util::stream::iter([
            Ok::<_, Infallible>(
                Event::default()
                    .event("execution.started")
                    .id("1")
                    .data(data),
            ),
            Ok(Event::default()
                .event("execution.completed")
                .id("12")
                .data("{}")),
        ]);
        let axum = bytes_of(Sse::new(events).into_response().into_body()).await;
        assert_eq!(frames, axum);
        assert_eq!(
            frame("tool.progress", 3, b"{}"),
            "event: tool.progress\nid: 3\ndata: {}\n\n"
        );
    }

    #[test]
    fn a_line_break_in_the_data_starts_another_data_line() {
        assert_eq!(
            frame("e", 1, b"a\nb\rc"),
            "event: e\nid: 1\ndata: a\ndata: b\ndata: c\n\n"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_stream_gets_keep_alive_comments_then_its_frames() {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel::<Bytes>();
        let frames = tokio_stream_of(receiver);
        let mut body = streamed(frames, Duration::from_secs(15));
        let keep_alive = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(keep_alive, ":\n\n");
        sender.send(frame("e", 1, b"{}")).unwrap();
        drop(sender);
        let event = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(event, "event: e\nid: 1\ndata: {}\n\n");
        assert!(body.frame().await.is_none());
    }

    fn tokio_stream_of(
        mut receiver: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
    ) -> impl Stream<Item = Bytes> + Send + 'static {
        futures_util::stream::poll_fn(move |context| receiver.poll_recv(context))
    }
}
