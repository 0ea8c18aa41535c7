//! `POST /agent/execute` (`protocol.md` §4): parses the request, drives the runtime, and
//! answers with JSON or Server-Sent Events. A client that goes away cancels the execution.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, LOCATION, RETRY_AFTER};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use futures_util::future::{Either, ready};
use futures_util::{FutureExt, Stream};
use http_body::Body as _;
use http_body_util::{LengthLimitError, Limited};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::catalog::Catalog;
use crate::context::{Event, EventReceiver, Requester, event_channel};
use crate::executions::running_body;
use crate::http::Admitted;
use crate::http::error::status_for;
use crate::http::requester::requester;
use crate::http::sse;
use crate::http::{Header, Present};
use crate::principal::Principal;
use crate::runtime::{self, Accepted, Answer, Call, Delivery, Outcome, Runtime, response};
use crate::settings::Current;
use crate::tool_error::{ToolError, clip, retry_after_secs};
use crate::wire::headers::AnswerHeaders;
use crate::wire::paths;
use crate::wire::{
    CARMY_REPLAYED, IDEMPOTENCY_KEY, JSON, NO_STORE, PREFER, PREFERENCE_APPLIED, RESPOND_ASYNC,
    codes,
};

/// The largest request body accepted.
pub(crate) const MAX_BODY_BYTES: usize = 1024 * 1024;

static TRUE: HeaderValue = HeaderValue::from_static("true");

/// What the execute endpoint needs besides the runtime.
#[derive(Clone)]
pub(crate) struct ExecuteState {
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) current: Current,
    pub(crate) keep_alive: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteBody {
    tool: String,
    #[serde(default = "empty_object")]
    arguments: Value,
    /// Absent, or a string: `null` is refused like any other non-string (`protocol.md` §4).
    #[serde(default, deserialize_with = "present")]
    request_id: Option<String>,
}

fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    String::deserialize(deserializer).map(Some)
}

fn empty_object() -> Value {
    json!({})
}

/// `POST /agent/execute`, run inside the gate ([`crate::http::gate::Endpoints::post_inline`]).
///
/// What the call needs of the request's head is read at once ([`CallHead`]), so the future,
/// stored inside the gate's and boxed per request, keeps none of the head: only the body being
/// read, then the answer.
pub(crate) fn execute(
    state: ExecuteState,
    request: Request,
) -> impl Future<Output = Response> + Send {
    let (mut parts, body) = request.into_parts();
    let Caller {
        principal,
        present,
        secured,
        catalog,
    } = Caller::of(&mut parts, &state.current);
    let head = CallHead::of(&parts.headers, present);
    let wanted = head.wanted;
    read_call(head, body, principal, catalog).then(move |call| match call {
        Ok(call) => Either::Left(answer(state, wanted, call, secured)),
        Err(error) => Either::Right(ready(crate::http::error::answer(&error, secured))),
    })
}

/// What a call takes from its request's head. The checks run at once, and their results are
/// applied in [`read_call`]'s order, before and after the body as its reader sees them.
struct CallHead {
    json: Result<(), ToolError>,
    idempotency_key: Result<Option<String>, ToolError>,
    requester: Result<Requester, ToolError>,
    wanted: Wanted,
}

impl CallHead {
    fn of(headers: &HeaderMap, present: Present) -> Self {
        CallHead {
            json: require_json(headers),
            idempotency_key: idempotency_key(headers, present),
            requester: requester(headers, present),
            wanted: Wanted::of(headers, present),
        }
    }
}

/// How the client wants its answer, from the request's headers.
#[derive(Clone, Copy)]
pub(super) struct Wanted {
    /// `Accept` takes Server-Sent Events.
    event_stream: bool,
    /// `Prefer: respond-async`.
    prefer_async: bool,
}

impl Wanted {
    /// `present`: the headers carmy reads that the request carries.
    pub(super) fn of(headers: &HeaderMap, present: Present) -> Self {
        Wanted {
            event_stream: present.has(Header::Accept) && wants_event_stream(headers),
            prefer_async: present.has(Header::Prefer) && prefers_async(headers),
        }
    }
}

/// What a route that executes takes from the gate's admission of its request.
pub(super) struct Caller {
    pub(super) principal: Principal,
    /// The headers carmy reads that the request carries, found by the gate.
    pub(super) present: Present,
    /// Whether answers carry the security headers.
    pub(super) secured: bool,
    /// The catalog of the configuration the gate admitted the request under.
    pub(super) catalog: Arc<Catalog>,
}

impl Caller {
    pub(super) fn of(parts: &mut Parts, current: &Current) -> Self {
        let Admitted {
            settings,
            principal,
            present,
        } = Admitted::take(parts, current);
        Caller {
            principal,
            present,
            secured: settings.protection.security_headers,
            catalog: Arc::clone(&settings.catalog),
        }
    }
}

/// Runs a parsed call and answers with JSON or, when the client accepts them, Server-Sent
/// Events: every route that executes answers through here.
///
/// The future stands for the client: dropped when it goes away, it cancels the execution.
pub(super) fn answer(
    state: ExecuteState,
    wanted: Wanted,
    call: Call,
    secured: bool,
) -> impl Future<Output = Response> + Send + use<> {
    if wanted.event_stream {
        return Either::Left(ready(stream(state, call)));
    }
    let prefer_async = wanted.prefer_async;
    let delivery = Delivery {
        cancel: None,
        events: None,
        prefer_async,
    };
    let answered = state.runtime.call(call, delivery);
    Either::Right(answered.map(move |answered| match answered {
        Answer::Outcome(outcome) => json_response(outcome, secured),
        Answer::Accepted(accepted) => accepted_response(&accepted, prefer_async),
    }))
}

/// Whether `Prefer` (RFC 7240: comma-separated preferences, each with optional parameters)
/// asks for `respond-async`; other preferences are ignored.
fn prefers_async(headers: &HeaderMap) -> bool {
    headers
        .get_all(&PREFER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|preference| {
            preference
                .split(';')
                .next()
                .is_some_and(|token| token.trim().eq_ignore_ascii_case("respond-async"))
        })
}

/// `202 Accepted`: where to read the execution back, and when.
fn accepted_response(accepted: &Accepted, prefer_async: bool) -> Response {
    let body = running_body(&accepted.execution_id, accepted.tool, None);
    let mut response = super::execution_routes::running(StatusCode::ACCEPTED, body);
    let headers = response.headers_mut();
    let location = format!("{}/{}", paths::EXECUTIONS, accepted.execution_id);
    if let Ok(location) = HeaderValue::try_from(location) {
        headers.insert(LOCATION, location);
    }
    if prefer_async {
        headers.insert(PREFERENCE_APPLIED.clone(), RESPOND_ASYNC.clone());
    }
    response
}

/// Checks the content type, reads at most [`MAX_BODY_BYTES`], and parses the request.
async fn read_call(
    head: CallHead,
    body: Body,
    principal: Principal,
    catalog: Arc<Catalog>,
) -> Result<Call, ToolError> {
    head.json?;
    let bytes = read_body(body).await?;
    let body: ExecuteBody = parse_body(&bytes)?;
    let header_key = head.idempotency_key?;
    let request_id = match (body.request_id, header_key) {
        (Some(body_id), Some(header_id)) if body_id != header_id => {
            return Err(ToolError::invalid_request(
                "request_id and the Idempotency-Key header differ",
            ));
        }
        (body_id, header_id) => body_id.or(header_id),
    };
    if let Some(request_id) = &request_id {
        runtime::check_request_id(request_id)?;
    }
    Ok(Call {
        catalog,
        tool: body.tool,
        arguments: body.arguments,
        request_id,
        principal,
        requester: head.requester?,
    })
}

/// A body that is not JSON is refused before it is read.
pub(super) fn require_json(headers: &HeaderMap) -> Result<(), ToolError> {
    // The type before any parameter, read as bytes: the usual value is exactly the type.
    let is_json = headers.get(CONTENT_TYPE).is_some_and(|value| {
        if value.as_bytes() == b"application/json" {
            return true;
        }
        let essence = value.as_bytes().split(|&byte| byte == b';').next();
        essence.is_some_and(|essence| {
            essence
                .trim_ascii()
                .eq_ignore_ascii_case(b"application/json")
        })
    });
    if is_json {
        Ok(())
    } else {
        Err(ToolError::invalid_request(
            "the content type must be application/json",
        ))
    }
}

/// Reads at most [`MAX_BODY_BYTES`] within the body deadline. A body whose length is known
/// to be larger (hyper's reading of its `Content-Length`) is refused before it is read.
pub(super) async fn read_body(body: Body) -> Result<Bytes, ToolError> {
    if body.size_hint().lower() > MAX_BODY_BYTES as u64 {
        return Err(payload_too_large());
    }
    match crate::http::whole_body(Limited::new(body, MAX_BODY_BYTES)).await {
        Ok(bytes) => Ok(bytes),
        Err(error) if error.is::<LengthLimitError>() => Err(payload_too_large()),
        Err(error) => Err(crate::http::unreadable_body(&*error)),
    }
}

/// Parses a JSON body; serde's messages quote what they refuse (an unknown field, a wrong
/// value), so they are clipped.
pub(super) fn parse_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ToolError> {
    serde_json::from_slice(bytes).map_err(|error| {
        ToolError::invalid_request(format!(
            "invalid request body: {}",
            clip(&error.to_string())
        ))
    })
}

/// The `Idempotency-Key` header: several that differ are refused, never "first wins".
pub(super) fn idempotency_key(
    headers: &HeaderMap,
    present: Present,
) -> Result<Option<String>, ToolError> {
    if !present.has(Header::IdempotencyKey) {
        return Ok(None);
    }
    let mut key: Option<&str> = None;
    for value in headers.get_all(&IDEMPOTENCY_KEY) {
        let value = value.to_str().map_err(|_| {
            ToolError::invalid_request("the Idempotency-Key header must be printable ASCII")
        })?;
        match key {
            Some(seen) if seen != value => {
                return Err(ToolError::invalid_request(
                    "the request has several different Idempotency-Key headers",
                ));
            }
            _ => key = Some(value),
        }
    }
    Ok(key.map(str::to_owned))
}

fn payload_too_large() -> ToolError {
    ToolError::validation(
        codes::PAYLOAD_TOO_LARGE,
        "the request body is larger than 1 MiB",
    )
    .details(json!({ "limit_bytes": MAX_BODY_BYTES }))
    .recoverable(true)
}

fn wants_event_stream(headers: &HeaderMap) -> bool {
    crate::http::accept::media_ranges(headers)
        .any(|(media, quality)| quality > 0.0 && media.eq_ignore_ascii_case("text/event-stream"))
}

/// The headers of an execution's JSON answer, and of a replayed one (a retry's answer, as
/// common as the calls agents retry).
static JSON_ANSWER: LazyLock<AnswerHeaders> = LazyLock::new(|| json_answer(false));
static JSON_REPLAYED: LazyLock<AnswerHeaders> = LazyLock::new(|| json_answer(true));

/// `Content-Length` is each answer's own.
fn json_answer(replayed: bool) -> AnswerHeaders {
    let mut own = vec![
        (CONTENT_TYPE, JSON.clone()),
        (CACHE_CONTROL, NO_STORE.clone()),
        (CONTENT_LENGTH, HeaderValue::from_static("0")),
    ];
    if replayed {
        own.push((CARMY_REPLAYED.clone(), TRUE.clone()));
    }
    AnswerHeaders::new(&own)
}

/// `secured`: whether the configuration the call was admitted under has security headers.
fn json_response(outcome: Outcome, secured: bool) -> Response {
    let Outcome {
        response,
        replayed,
        retry_after,
    } = outcome;
    let length = response.body.len();
    let mut answer = Response::new(Body::from(response.body));
    *answer.status_mut() = status_for(response.category, response.code.as_deref());
    let headers = answer.headers_mut();
    let made = if replayed {
        &JSON_REPLAYED
    } else {
        &JSON_ANSWER
    };
    *headers = made.answer(secured);
    headers.insert(CONTENT_LENGTH, crate::http::content_length(length));
    if let Some(after) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
    }
    answer
}

/// Answers as Server-Sent Events: `execution.started`, `tool.progress`…, then
/// `execution.completed`, with sequential ids.
fn stream(state: ExecuteState, call: Call) -> Response {
    // Cancels the execution when the stream is dropped: the client went away.
    let cancel = CancellationToken::new();
    let guard = cancel.clone().drop_guard();
    let (sender, receiver) = event_channel();
    let runtime = state.runtime;
    let events = EventStream {
        events: receiver,
        next_id: 1,
        execution_id: None,
        guard: Some(guard),
    };
    match runtime::poll_once(async move { runtime.execute(call, cancel, Some(sender)).await }) {
        // A tool that ends at once is answered with all its events in one body: no task, no
        // stream, no keep-alive timer.
        Ok(ended) => sse::response(Body::from(events.all(&ended))),
        // One that waits runs on in its own task, whatever the client's pace of reading (its
        // deadline included).
        Err(waiting) => {
            let (done, outcome) = oneshot::channel();
            tokio::spawn(async move {
                let _ = done.send(waiting.await);
            });
            sse::response(sse::streamed(events.into_stream(outcome), state.keep_alive))
        }
    }
}

struct EventStream {
    events: EventReceiver,
    next_id: u64,
    /// Known once `execution.started` was sent.
    execution_id: Option<Arc<str>>,
    /// Dropped with the stream when the client goes away; disarmed once the answer is sent.
    guard: Option<DropGuard>,
}

impl EventStream {
    /// Every event of an execution that has ended, framed into one buffer.
    fn all(mut self, outcome: &Outcome) -> Vec<u8> {
        let mut frames = Vec::new();
        while let Some(event) = self.events.try_recv() {
            self.runtime_event(&mut frames, event);
        }
        self.completed(&mut frames, outcome);
        frames
    }

    /// The events as they come, each a frame of its own, until the execution's outcome.
    fn into_stream(self, outcome: oneshot::Receiver<Outcome>) -> impl Stream<Item = Bytes> {
        futures_util::stream::unfold((self, outcome), |(mut state, mut outcome)| async move {
            // Ended once the answer was sent.
            state.guard.as_ref()?;
            let mut frame = Vec::new();
            tokio::select! {
                biased;
                event = state.events.recv() => state.runtime_event(&mut frame, event),
                ended = &mut outcome => state.completed(&mut frame, &ended.ok()?),
            }
            Some((Bytes::from(frame), (state, outcome)))
        })
    }

    fn runtime_event(&mut self, frames: &mut Vec<u8>, event: Event) {
        match event {
            Event::Started { execution_id, tool } => {
                let data = response::started_data(&execution_id, &tool);
                self.execution_id = Some(execution_id);
                self.append(frames, "execution.started", data.as_bytes());
            }
            Event::Progress(progress) => {
                let execution_id = self.execution_id.as_deref().unwrap_or_default();
                let data = response::progress_data(execution_id, &progress);
                self.append(frames, "tool.progress", &data);
            }
        }
    }

    /// The last event: queued progress was sent first, since the select is biased to events.
    fn completed(&mut self, frames: &mut Vec<u8>, outcome: &Outcome) {
        if let Some(guard) = self.guard.take() {
            guard.disarm();
        }
        let data = response::with_replayed(&outcome.response.body, outcome.replayed);
        self.append(frames, "execution.completed", data.as_bytes());
    }

    fn append(&mut self, frames: &mut Vec<u8>, name: &str, data: &[u8]) {
        let id = self.next_id;
        self.next_id += 1;
        sse::append(frames, name, id, data);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_with_any_parameters_is_json() {
        let is_json = |value: Option<&'static str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            }
            require_json(&headers).is_ok()
        };
        assert!(is_json(Some("application/json")));
        assert!(is_json(Some("Application/JSON")));
        assert!(is_json(Some(" application/json ; charset=utf-8")));
        assert!(is_json(Some("application/json;")));
        assert!(!is_json(Some("application/jsonx")));
        assert!(!is_json(Some("application/json-patch+json")));
        assert!(!is_json(Some("text/plain; application/json")));
        assert!(!is_json(Some("")));
        assert!(!is_json(None));
    }
}
