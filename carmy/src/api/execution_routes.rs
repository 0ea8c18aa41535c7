//! `/agent/executions` (`protocol.md` §9): a caller's executions read back by id, their events
//! replayed and followed over SSE, cancelled, and listed a page at a time.

use std::collections::HashMap;
use std::time::Duration;

use axum::Router;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Serialize;
use serde_json::json;

use super::bad_parameter;
use crate::executions::{
    self, CANCEL_SETTLES_WITHIN, Cancelled, Executions, RETRY_AFTER as RUNNING_RETRY_AFTER,
};
use crate::http::Admitted;
use crate::http::GateLayer;
use crate::http::sse;
use crate::store::{ExecutionQuery, ExecutionState};
use crate::tool_error::{ToolError, clip, retry_after_secs};
use crate::wire::execution_list::{DEFAULT_PAGE, MAX_PAGE};
use crate::wire::paths;
use crate::wire::{JSON, LAST_EVENT_ID, NO_STORE, codes};

/// What the executions endpoints need.
#[derive(Clone)]
pub(crate) struct ExecutionsState {
    pub(crate) executions: Executions,
    pub(crate) keep_alive: Duration,
}

pub(crate) fn router(gate: &GateLayer, state: ExecutionsState) -> Router {
    let executions = gate.endpoints(state);
    Router::new()
        .route(paths::EXECUTIONS, executions.get(list))
        .route(
            &format!("{}/{{execution_id}}", paths::EXECUTIONS),
            executions
                .get(lookup)
                .delete_service(executions.handler(cancel)),
        )
        .route(
            &format!("{}/{{execution_id}}/events", paths::EXECUTIONS),
            executions.get(events),
        )
}

fn not_found() -> ToolError {
    ToolError::not_found(codes::EXECUTION_NOT_FOUND, "no such execution").recoverable(false)
}

/// The id in the path; one that cannot even be decoded is a missing execution too.
fn execution_id(path: Result<Path<String>, PathRejection>) -> Result<String, ToolError> {
    path.map(|Path(id)| id).map_err(|_| not_found())
}

/// A JSON answer with `Cache-Control: no-store`.
fn json_answer(status: StatusCode, body: impl Into<axum::body::Body>) -> Response {
    let mut response = (status, body.into()).into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, JSON.clone());
    headers.insert(CACHE_CONTROL, NO_STORE.clone());
    response
}

/// The `202`/`200` of a running execution: its running body and when to look again.
pub(crate) fn running(status: StatusCode, body: bytes::Bytes) -> Response {
    let mut response = json_answer(status, body);
    response.headers_mut().insert(
        RETRY_AFTER,
        HeaderValue::from(retry_after_secs(RUNNING_RETRY_AFTER)),
    );
    response
}

async fn lookup(
    State(state): State<ExecutionsState>,
    path: Result<Path<String>, PathRejection>,
    request: Request,
) -> Result<Response, ToolError> {
    let execution_id = execution_id(path)?;
    let record = state
        .executions
        .lookup(
            &Admitted::caller_or_anonymous(request.extensions()),
            &execution_id,
        )
        .await?
        .ok_or_else(not_found)?;
    Ok(match record.outcome {
        // The answer's body exactly as the call gave it, with `200` whatever the outcome: the
        // execution exists, and its body says how it ended (a tool's own not-found is not the
        // execution's `404`).
        Some(ended) => json_answer(StatusCode::OK, ended.response.body),
        None => running(
            StatusCode::OK,
            executions::running_body(
                &record.execution_id,
                &record.tool,
                record.progress.last().map(|event| &event.data),
            ),
        ),
    })
}

/// `202` only when the cancellation takes effect (the execution ends `cancelled`, or still
/// runs after [`CANCEL_SETTLES_WITHIN`]: the request stands); `409` when the execution ended
/// otherwise, even as the request arrived.
async fn cancel(
    State(state): State<ExecutionsState>,
    path: Result<Path<String>, PathRejection>,
    request: Request,
) -> Result<Response, ToolError> {
    let execution_id = execution_id(path)?;
    let principal = Admitted::caller_or_anonymous(request.extensions());
    let cancelled = state
        .executions
        .cancel_settled(&principal, &execution_id, CANCEL_SETTLES_WITHIN)
        .await?;
    match cancelled {
        Cancelled::NotFound => Err(not_found()),
        Cancelled::Ended => Err(ToolError::conflict(
            codes::EXECUTION_ENDED,
            "the execution has ended; there is nothing to cancel",
        )
        .details(json!({ "execution_id": clip(&execution_id) }))
        .recoverable(false)),
        Cancelled::Accepted(record) => Ok(running(
            StatusCode::ACCEPTED,
            executions::running_body(&record.execution_id, &record.tool, None),
        )),
    }
}

async fn events(
    State(state): State<ExecutionsState>,
    path: Result<Path<String>, PathRejection>,
    request: Request,
) -> Result<Response, ToolError> {
    let execution_id = execution_id(path)?;
    let after = last_event_id(request.headers())?;
    let events = state
        .executions
        .events(
            &Admitted::caller_or_anonymous(request.extensions()),
            &execution_id,
            after,
        )
        .await?
        .ok_or_else(not_found)?;
    let frames = events.map(|event| sse::frame(event.name, event.id, event.data.as_bytes()));
    Ok(sse::response(sse::streamed(frames, state.keep_alive)))
}

/// `Last-Event-ID`: resume after that event; absent, from the start.
fn last_event_id(headers: &HeaderMap) -> Result<u64, ToolError> {
    let Some(value) = headers.get(&LAST_EVENT_ID) else {
        return Ok(0);
    };
    value
        .to_str()
        .ok()
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| {
            bad_parameter(
                "Last-Event-ID",
                "Last-Event-ID must be the id of an event of this stream",
            )
        })
}

#[derive(Serialize)]
struct ListBody<'a> {
    executions: Vec<ListEntry<'a>>,
    next_cursor: Option<&'a str>,
}

#[derive(Serialize)]
struct ListEntry<'a> {
    execution_id: &'a str,
    tool: &'a str,
    status: &'static str,
    created_at: String,
}

async fn list(
    State(state): State<ExecutionsState>,
    query: Result<Query<HashMap<String, String>>, QueryRejection>,
    request: Request,
) -> Result<Response, ToolError> {
    let Query(parameters) =
        query.map_err(|_| bad_parameter("query", "the query string could not be decoded"))?;
    let query = list_query(&parameters)?;
    let page = state
        .executions
        .list(&Admitted::caller_or_anonymous(request.extensions()), query)
        .await?;
    let body = ListBody {
        executions: page
            .executions
            .iter()
            .map(|summary| ListEntry {
                execution_id: &summary.execution_id,
                tool: &summary.tool,
                status: summary.state.as_str(),
                created_at: executions::created_at(&summary.execution_id),
            })
            .collect(),
        next_cursor: page.next_cursor.as_deref(),
    };
    let body = serde_json::to_vec(&body).expect("a list of executions serializes");
    Ok(json_answer(StatusCode::OK, body))
}

/// `status`, `tool`, `limit` and `cursor`, checked; other parameters are ignored.
fn list_query(parameters: &HashMap<String, String>) -> Result<ExecutionQuery, ToolError> {
    let state = parameters
        .get("status")
        .map(|status| {
            ExecutionState::from_wire(status).ok_or_else(|| {
                bad_parameter(
                    "status",
                    "status must be one of running, completed, failed, cancelled, timed_out",
                )
            })
        })
        .transpose()?;
    let limit = super::page_limit(parameters, DEFAULT_PAGE, MAX_PAGE)?;
    let before = parameters
        .get("cursor")
        .map(|cursor| {
            if executions::is_execution_id(cursor) {
                Ok(cursor.clone())
            } else {
                Err(bad_parameter(
                    "cursor",
                    "cursor must be a next_cursor this endpoint returned",
                ))
            }
        })
        .transpose()?;
    Ok(ExecutionQuery {
        state,
        tool: parameters.get("tool").cloned(),
        before,
        limit,
    })
}
