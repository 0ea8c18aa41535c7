//! `/agent/events/subscriptions` (`protocol.md` §8): webhook subscriptions, managed by
//! `internal` callers and holders of `manage:events`. To anyone else, and while events are
//! off, every one of these routes is the `404` of an unknown route.

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::execute::{parse_body, read_body, require_json};
use crate::events::{
    EventPolicy, Events, NewSubscription, Page, SubscriptionChange, SubscriptionView,
};
use crate::http::GateLayer;
use crate::tool_error::ToolError;
use crate::webhook::SigningSecret;
use crate::wire::subscriptions::{DEFAULT_PAGE, MAX_PAGE};
use crate::wire::{JSON, NO_STORE, paths};

/// The permission that opens the routes to a caller below `internal`.
pub(super) const MANAGE_EVENTS: &str = "manage:events";

pub(crate) fn router(gate: &GateLayer, events: Arc<Events>) -> Router {
    let one = format!("{}/{{id}}", paths::SUBSCRIPTIONS);
    let events = gate.endpoints(events);
    let wrong_method = || events.handler(wrong_method);
    Router::new()
        .route(
            paths::SUBSCRIPTIONS,
            events
                .get(list)
                .post_service(events.handler(create))
                .fallback_service(wrong_method()),
        )
        .route(
            &one,
            events
                .get(read)
                .delete_service(events.handler(delete))
                .patch_service(events.handler(update))
                .fallback_service(wrong_method()),
        )
        .route(
            &format!("{one}/rotate-secret"),
            events.post(rotate_secret).fallback_service(wrong_method()),
        )
        .route(
            &format!("{one}/deliveries"),
            events.get(deliveries).fallback_service(wrong_method()),
        )
}

/// A method these routes do not take: `405` to a caller who may manage subscriptions, the
/// unknown route's `404` to anyone else (and while events are off), so that no method reveals
/// the routes.
async fn wrong_method(State(events): State<Arc<Events>>, request: Request) -> Response {
    match allowed(&events, &request) {
        Ok(_) => crate::http::method_not_allowed(request).await,
        Err(_) => crate::http::route_not_found(request).await,
    }
}

/// The `[events]` settings when the caller may manage subscriptions; the unknown route's 404
/// otherwise.
fn allowed(events: &Events, request: &Request) -> Result<Arc<EventPolicy>, ToolError> {
    match events.settings() {
        Some(settings) if super::may_manage(request, MANAGE_EVENTS) => Ok(settings),
        _ => Err(crate::http::not_a_route()),
    }
}

/// A subscription with its secret: shown once, on creation and on rotation.
fn with_secret(view: &SubscriptionView, secret: &SigningSecret) -> Value {
    let mut shown = view.to_json();
    shown["secret"] = json!(secret.to_whsec());
    shown
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [
            (CONTENT_TYPE, JSON.clone()),
            (CACHE_CONTROL, NO_STORE.clone()),
        ],
        body.to_string(),
    )
        .into_response()
}

/// A handler's answer: its JSON, or its error's.
fn answer(result: Result<Response, ToolError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    url: String,
    event_types: Vec<String>,
    #[serde(default)]
    description: Option<String>,
}

async fn create(State(events): State<Arc<Events>>, request: Request) -> Response {
    answer(
        async move {
            let settings = allowed(&events, &request)?;
            let (parts, body) = request.into_parts();
            require_json(&parts.headers)?;
            let body: CreateBody = parse_body(&read_body(body).await?)?;
            let (view, secret) = events
                .create(
                    &settings,
                    NewSubscription {
                        url: body.url,
                        event_types: body.event_types,
                        description: body.description,
                    },
                )
                .await?;
            let mut response = json_response(StatusCode::CREATED, &with_secret(&view, &secret));
            if let Ok(location) =
                HeaderValue::from_str(&format!("{}/{}", paths::SUBSCRIPTIONS, view.id))
            {
                response.headers_mut().insert(LOCATION, location);
            }
            Ok(response)
        }
        .await,
    )
}

/// A page of the subscriptions, `?limit=` (default 20, at most 100) after `?cursor=` (the
/// previous page's `next_cursor`, `null` on the last page).
async fn list(State(events): State<Arc<Events>>, request: Request) -> Response {
    answer(
        async move {
            let settings = allowed(&events, &request)?;
            let page = page_of(request.uri())?;
            let (views, next_cursor) = events.list(&settings, &page).await?;
            let listed: Vec<Value> = views.iter().map(SubscriptionView::to_json).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({ "subscriptions": listed, "next_cursor": next_cursor.as_deref() }),
            ))
        }
        .await,
    )
}

/// `limit` and `cursor`, checked; other parameters are ignored.
fn page_of(uri: &Uri) -> Result<Page, ToolError> {
    let Query(parameters) = Query::<HashMap<String, String>>::try_from_uri(uri)
        .map_err(|_| super::bad_parameter("query", "the query string could not be decoded"))?;
    let limit = super::page_limit(&parameters, DEFAULT_PAGE, MAX_PAGE)?;
    let after = parameters
        .get("cursor")
        .map(|cursor| {
            // An id: `sub_` and a few dozen letters, digits and underscores.
            let id_like = cursor.starts_with("sub_")
                && cursor.len() <= 64
                && cursor
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_');
            if id_like {
                Ok(cursor.clone())
            } else {
                Err(super::bad_parameter(
                    "cursor",
                    "cursor must be a next_cursor this endpoint returned",
                ))
            }
        })
        .transpose()?;
    Ok(Page { limit, after })
}

async fn read(
    State(events): State<Arc<Events>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    answer(
        async move {
            let settings = allowed(&events, &request)?;
            let view = events.get(&settings, &id).await?;
            Ok(json_response(StatusCode::OK, &view.to_json()))
        }
        .await,
    )
}

async fn delete(
    State(events): State<Arc<Events>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    answer(
        async move {
            let settings = allowed(&events, &request)?;
            events.delete(&settings, &id).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        .await,
    )
}

/// What `PATCH` may change; `description: null` clears it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateBody {
    #[serde(default)]
    enabled: Option<bool>,
    #[serde(default)]
    event_types: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    description: Option<Option<String>>,
}

/// A field that is present, even as `null`.
fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(deserializer).map(Some)
}

async fn update(
    State(events): State<Arc<Events>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    answer(
        async move {
            let settings = allowed(&events, &request)?;
            let (parts, body) = request.into_parts();
            require_json(&parts.headers)?;
            let body: UpdateBody = parse_body(&read_body(body).await?)?;
            let change = SubscriptionChange {
                enabled: body.enabled,
                event_types: body.event_types,
                description: body.description,
            };
            let view = events.update(&settings, &id, change).await?;
            Ok(json_response(StatusCode::OK, &view.to_json()))
        }
        .await,
    )
}

async fn rotate_secret(
    State(events): State<Arc<Events>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    answer(
        async move {
            let settings = allowed(&events, &request)?;
            crate::http::empty_body(request.into_body(), "the rotation").await?;
            let (view, secret) = events.rotate_secret(&settings, &id).await?;
            Ok(json_response(StatusCode::OK, &with_secret(&view, &secret)))
        }
        .await,
    )
}

async fn deliveries(
    State(events): State<Arc<Events>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    answer(
        async move {
            let settings = allowed(&events, &request)?;
            let attempts: Vec<Value> = events
                .deliveries(&settings, &id)
                .await?
                .iter()
                .map(|attempt| {
                    json!({
                        "event_id": &*attempt.event_id,
                        "at": humantime::format_rfc3339_millis(attempt.at).to_string(),
                        "status_code": attempt.status,
                        "duration_ms": u64::try_from(attempt.duration.as_millis()).unwrap_or(u64::MAX),
                        "error": attempt.error,
                    })
                })
                .collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({ "deliveries": attempts }),
            ))
        }
        .await,
    )
}
