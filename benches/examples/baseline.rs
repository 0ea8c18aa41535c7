//! The physical limit carmy is measured against: the shop's `create_order` and `list_products`
//! as hand-written axum handlers doing the same work — serde decode with unknown fields denied,
//! JSON Schema validation with the same validator, the same tool body, the same response JSON
//! with a UUID v7 execution id, a hand-rolled idempotency map, SSE, and the catalog with ETags.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::{ACCEPT, CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteBody {
    tool: String,
    #[serde(default)]
    arguments: Option<Value>,
    #[serde(default)]
    request_id: Option<String>,
}

struct Baseline {
    shop: shop::Shop,
    create_order: jsonschema::Validator,
    list_products: jsonschema::Validator,
    records: Mutex<HashMap<String, Bytes>>,
    catalog: Bytes,
    etag: HeaderValue,
}

type Shared = Arc<Baseline>;

async fn execute(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<ExecuteBody>(&body) else {
        return (
            StatusCode::BAD_REQUEST,
            "{\"error\":{\"code\":\"INVALID_REQUEST\"}}",
        )
            .into_response();
    };
    if let Some(request_id) = &request.request_id
        && let Some(recorded) = app.records.lock().unwrap().get(request_id).cloned()
    {
        return json(recorded, true);
    }
    let arguments = request
        .arguments
        .unwrap_or_else(|| Value::Object(Default::default()));
    let data = match request.tool.as_str() {
        "create_order" => {
            if !app.create_order.is_valid(&arguments) {
                return (
                    StatusCode::BAD_REQUEST,
                    "{\"error\":{\"code\":\"INVALID_ARGUMENTS\"}}",
                )
                    .into_response();
            }
            let Ok(input) = shop::NewOrder::deserialize(&arguments) else {
                return (
                    StatusCode::BAD_REQUEST,
                    "{\"error\":{\"code\":\"INVALID_ARGUMENTS\"}}",
                )
                    .into_response();
            };
            match shop::create_order(carmy::State(app.shop.clone()), input).await {
                Ok(placed) => serde_json::value::to_raw_value(&placed).unwrap(),
                Err(_) => {
                    return (
                        StatusCode::CONFLICT,
                        "{\"error\":{\"code\":\"OUT_OF_STOCK\"}}",
                    )
                        .into_response();
                }
            }
        }
        "list_products" => {
            if !app.list_products.is_valid(&arguments) {
                return (
                    StatusCode::BAD_REQUEST,
                    "{\"error\":{\"code\":\"INVALID_ARGUMENTS\"}}",
                )
                    .into_response();
            }
            let products = shop::list_products(carmy::State(app.shop.clone()))
                .await
                .unwrap();
            serde_json::value::to_raw_value(&products).unwrap()
        }
        _ => {
            return (
                StatusCode::NOT_FOUND,
                "{\"error\":{\"code\":\"TOOL_NOT_FOUND\"}}",
            )
                .into_response();
        }
    };
    let body = Bytes::from(response_body(&data, request.tool == "list_products"));
    if let Some(request_id) = request.request_id {
        app.records.lock().unwrap().insert(request_id, body.clone());
    }
    let streaming = headers
        .get(ACCEPT)
        .is_some_and(|accept| accept.as_bytes().starts_with(b"text/event-stream"));
    if streaming {
        return stream(&body);
    }
    json(body, false)
}

fn response_body(data: &RawValue, cacheable: bool) -> String {
    format!(
        "{{\"execution_id\":\"exec_{}\",\"status\":\"completed\",\"data\":{},\"_agent\":{{\"cacheable\":{cacheable},\"next_actions\":[]}}}}",
        uuid::Uuid::now_v7(),
        data.get()
    )
}

fn json(body: Bytes, replayed: bool) -> Response {
    let mut response = (
        [
            (CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        body,
    )
        .into_response();
    if replayed {
        response
            .headers_mut()
            .insert("carmy-replayed", HeaderValue::from_static("true"));
    }
    response
}

fn stream(body: &Bytes) -> Response {
    let text = String::from_utf8(body.to_vec()).unwrap();
    let execution_id = text[17..58].to_owned();
    let completed = format!("{},\"replayed\":false}}", &text[..text.len() - 1]);
    let events = [
        Event::default()
            .event("execution.started")
            .id("1")
            .data(format!(
                "{{\"execution_id\":\"{execution_id}\",\"tool\":\"create_order\"}}"
            )),
        Event::default()
            .event("execution.completed")
            .id("2")
            .data(completed),
    ];
    let stream = futures_util::stream::iter(events.map(Ok::<_, Infallible>));
    let mut response = Sse::new(stream).into_response();
    response
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn serve_catalog(State(app): State<Shared>, headers: HeaderMap) -> Response {
    let cached = headers
        .get(IF_NONE_MATCH)
        .is_some_and(|value| value == app.etag);
    let common = [
        (ETAG, app.etag.clone()),
        (
            CACHE_CONTROL,
            HeaderValue::from_static("private, max-age=60"),
        ),
    ];
    if cached {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        app.catalog.clone(),
    )
        .into_response()
}

#[tokio::main]
async fn main() {
    let addr = std::env::var("CARMY_ADDR").unwrap_or_else(|_| "127.0.0.1:3005".to_owned());
    // The same catalog bytes carmy serves, read from carmy's router once at start-up.
    let carmy_router = shop::app().router().expect("shop builds");
    let response = tower::ServiceExt::oneshot(
        carmy_router,
        axum::http::Request::get("/agent/tools")
            .body(axum::body::Body::empty())
            .unwrap(),
    )
    .await
    .unwrap();
    let etag = response.headers()[ETAG].clone();
    let catalog = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let app = Arc::new(Baseline {
        shop: shop::Shop::new(),
        create_order: jsonschema::validator_for(&(shop::create_order::TOOL.input_schema)())
            .unwrap(),
        list_products: jsonschema::validator_for(&(shop::list_products::TOOL.input_schema)())
            .unwrap(),
        records: Mutex::new(HashMap::new()),
        catalog,
        etag,
    });
    let router = Router::new()
        .route("/agent/execute", post(execute))
        .route("/agent/tools", get(serve_catalog))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    axum::serve(listener, router).await.unwrap();
}
