//! What every transport served over HTTP shares (carmy/1's routes, MCP's Streamable HTTP):
//! the gate every route sits behind and its admission, the error envelope, request bodies read
//! within their bounds and deadline, Server-Sent Events, and who is asking (a person or an
//! agent). The routes themselves are their transports'.

pub(crate) mod accept;
mod admission;
mod admitted;
pub(crate) mod error;
pub(crate) mod gate;
pub(crate) mod origin;
mod present;
pub(crate) mod requester;
pub(crate) mod sse;

use std::sync::OnceLock;
use std::time::Duration;

use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};

use crate::principal::TrustLevel;
use crate::tool_error::{Category, ToolError};
use crate::wire::{codes, paths};

#[cfg(feature = "mcp")]
pub(crate) use admission::Admission;
pub(crate) use admitted::{Admitted, settings_of};
pub(crate) use gate::GateLayer;
pub(crate) use present::{Header, Present};

/// The headers of an answer, at most: its own four, the gate's five (the version, the security
/// headers), `Content-Length`. A route that reserves this much allocates its header map once,
/// rather than once and again when the gate adds its own.
pub(crate) const RESPONSE_HEADERS: usize = 10;

/// How the HTTP adapter is tuned; set through the [`App`](crate::App) builder.
#[derive(Clone)]
pub(crate) struct HttpOptions {
    /// How often an SSE stream sends a keep-alive comment while the tool is quiet.
    pub(crate) keep_alive: Duration,
    /// How long a request body may take to arrive, from the end of its head.
    pub(crate) body_timeout: Duration,
    /// The least trusted caller that may read `/metrics` (when metrics are on), unless the
    /// configuration says otherwise (the snapshot's `metrics_trust`).
    pub(crate) metrics_trust: TrustLevel,
}

impl Default for HttpOptions {
    fn default() -> Self {
        HttpOptions {
            keep_alive: Duration::from_secs(15),
            body_timeout: crate::config::MAX_BODY_TIMEOUT,
            metrics_trust: TrustLevel::Anonymous,
        }
    }
}

/// Whether `path` is a probe: probes spend no rate-limit budget.
pub(crate) fn is_probe(path: &str) -> bool {
    matches!(path, paths::HEALTH | paths::LIVE | paths::READY)
}

/// Whether `path` is one of the console's files: the same bytes for everyone, from memory.
pub(crate) fn is_console(path: &str) -> bool {
    cfg!(feature = "console") && path.starts_with(paths::CONSOLE.trim_end_matches('/'))
}

/// The JSON 404 of carmy's paths, and of every path when carmy owns the server.
pub(crate) async fn route_not_found(request: axum::extract::Request) -> Response {
    refusal(&request, not_a_route())
}

pub(crate) fn not_a_route() -> ToolError {
    ToolError::not_found(codes::ROUTE_NOT_FOUND, "no such route").recoverable(false)
}

/// The envelope of `error`, with the gate's headers copied from a map made once when the gate
/// admitted `request` (whose snapshot says whether security headers are on).
fn refusal(request: &axum::extract::Request, error: ToolError) -> Response {
    match request.extensions().get::<Admitted>() {
        Some(admitted) => error::answer(&error, admitted.settings.protection.security_headers),
        None => error.into_response(),
    }
}

/// A whole request body. One that arrives in a single frame (the usual small body, read with
/// its head) is that frame's bytes as they are, with no poll after its end: http-body-util's
/// `collect` queues every frame, polls once more for the end, and copies the queue out again.
pub(crate) async fn whole_body<B>(mut body: B) -> Result<bytes::Bytes, B::Error>
where
    B: http_body::Body<Data = bytes::Bytes> + Unpin,
{
    use http_body_util::BodyExt;
    let mut first = None;
    let mut joined = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        // Trailers carry no bytes of the body.
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            earlier => {
                joined.extend_from_slice(&earlier.unwrap_or_default());
                joined.extend_from_slice(&data);
            }
        }
        if body.is_end_stream() {
            break;
        }
    }
    Ok(first.unwrap_or_else(|| joined.freeze()))
}

/// The `Content-Length` of a body of `length` bytes. That of the usual answer (up to 2 KiB) is
/// made once per length and cloned, a reference count; `HeaderValue::from` formats it and
/// allocates its bytes every time.
pub(crate) fn content_length(length: usize) -> HeaderValue {
    static MADE: [OnceLock<HeaderValue>; 2048] = [const { OnceLock::new() }; 2048];
    match MADE.get(length) {
        Some(made) => made.get_or_init(|| HeaderValue::from(length)).clone(),
        None => HeaderValue::from(length),
    }
}

/// A route that takes no input refuses a body rather than ignoring it.
pub(crate) async fn empty_body(body: axum::body::Body, what: &str) -> Result<(), ToolError> {
    use http_body_util::{BodyExt, Limited};
    match Limited::new(body, 0).collect().await {
        Ok(_) => Ok(()),
        Err(error) if body_timed_out(&*error) => Err(body_timeout()),
        Err(_) => Err(ToolError::invalid_request(format!(
            "{what} takes no request body"
        ))),
    }
}

/// The JSON 405 of a route's other methods.
pub(crate) async fn method_not_allowed(request: axum::extract::Request) -> Response {
    refusal(&request, wrong_method())
}

fn wrong_method() -> ToolError {
    ToolError::validation(
        codes::METHOD_NOT_ALLOWED,
        "method not allowed on this route",
    )
    .recoverable(false)
}

/// Whether reading a body failed because its deadline passed (the [`GateLayer`]'s).
fn body_timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    std::iter::successors(Some(error), |error| error.source())
        .any(|error| error.is::<gate::BodyTimedOut>())
}

/// Why a request body could not be read, as the answer says it: its deadline passed (`408`),
/// or the client broke it off or sent it malformed (`400`).
pub(crate) fn unreadable_body(error: &(dyn std::error::Error + 'static)) -> ToolError {
    if body_timed_out(error) {
        body_timeout()
    } else {
        ToolError::invalid_request(format!("the request body could not be read: {error}"))
    }
}

fn body_timeout() -> ToolError {
    ToolError::new(
        Category::Cancelled,
        codes::REQUEST_TIMEOUT,
        "the request body did not arrive within the body timeout",
    )
    .retryable(None)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http_body::Frame;
    use http_body_util::{Full, StreamBody};

    use super::*;

    #[tokio::test]
    async fn a_body_in_one_frame_or_many_is_read_whole() {
        let one = whole_body(Full::new(Bytes::from_static(b"{\"tool\":\"x\"}"))).await;
        assert_eq!(one.unwrap(), Bytes::from_static(b"{\"tool\":\"x\"}"));
        // Empty frames, trailers and frames of every size, in order.
        let mut trailers = axum::http::HeaderMap::new();
        trailers.insert("x-trailer", HeaderValue::from_static("1"));
        let frames = vec![
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::new())),
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Ok(Frame::data(Bytes::new())),
            Ok(Frame::data(Bytes::from_static(b"c"))),
            Ok(Frame::data(Bytes::from(vec![b'd'; 70_000]))),
            Ok(Frame::trailers(trailers)),
        ];
        let many = whole_body(StreamBody::new(futures_util::stream::iter(frames))).await;
        let mut expected = b"abc".to_vec();
        expected.extend(std::iter::repeat_n(b'd', 70_000));
        assert_eq!(many.unwrap(), Bytes::from(expected));
        let none = whole_body(Full::new(Bytes::new())).await;
        assert!(none.unwrap().is_empty());
    }

    #[test]
    fn content_lengths_made_once_are_the_lengths() {
        for length in [0, 1, 9, 10, 2047, 2048, 2049, 1 << 20] {
            for _ in 0..2 {
                assert_eq!(content_length(length), HeaderValue::from(length));
            }
        }
    }
}
