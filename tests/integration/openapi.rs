//! `GET /agent/openapi.json` and `POST /agent/tools/{name}` (protocol.md §11): the document per
//! trust level, snapshotted and checked for structure; the per-tool route against
//! `/agent/execute`, answer for answer. Set `CARMY_BLESS=1` to rewrite the snapshots after an
//! intended change (refused where `CI` is set).

use std::collections::BTreeSet;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use carmy_tests::{Answer, bearer, execute_request, get, get_as, parse_sse, send, send_empty};
use serde_json::{Value, json};

const SNAPSHOTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots");
const SHOP_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/shop/carmy.toml");
const KNOWN_TOKEN: &str = "shop-known-demo-token";
const INTERNAL_TOKEN: &str = "shop-internal-demo-token";

/// The example as shipped: its tools and its `carmy.toml` (demo tokens, rate limits).
fn shop() -> Router {
    let config = carmy::config::Config::load_from(SHOP_CONFIG.as_ref()).unwrap();
    shop::app().config(config).router().unwrap()
}

async fn openapi_as(router: &Router, token: Option<&str>) -> Value {
    let answer = get_as(router, "/agent/openapi.json", token).await;
    assert_eq!(answer.status, StatusCode::OK);
    answer.json()
}

/// `POST /agent/tools/{tool}`, declared JSON, with `body` (an empty one when `None`) and extra
/// headers.
fn tool_request(tool: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::post(format!("/agent/tools/{tool}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = body.map_or_else(Body::empty, |body| Body::from(body.to_string()));
    request
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

/// The answer's JSON without its `execution_id`, which differs between two executions.
fn without_execution_id(answer: &Answer) -> Value {
    let mut body = answer.json();
    if let Some(fields) = body.as_object_mut() {
        assert!(
            fields
                .remove("execution_id")
                .is_none_or(|id| id.as_str().unwrap().starts_with("exec_"))
        );
    }
    body
}

fn assert_snapshot(name: &str, document: &Value) {
    let pretty = serde_json::to_string_pretty(document).unwrap() + "\n";
    carmy_tests::assert_snapshot(format!("{SNAPSHOTS}/{name}").as_ref(), &pretty);
}

/// Fails unless `answer` is one of the answers the document promises for `path`: its status is
/// documented, and its JSON body matches the schema documented for that status.
fn assert_documented(document: &Value, path: &str, answer: &Answer) {
    let status = answer.status.as_u16().to_string();
    let mut response = &document["paths"][path]["post"]["responses"][&status];
    if let Some(reference) = response["$ref"].as_str() {
        response = document
            .pointer(reference.strip_prefix('#').unwrap())
            .unwrap();
    }
    let schema = &response["content"]["application/json"]["schema"];
    assert!(schema.is_object(), "{path} does not document {status}");
    // References point into the document: validate inside it.
    let root = json!({ "components": document["components"], "allOf": [schema] });
    let validator = jsonschema::draft202012::new(&root).unwrap();
    let body = answer.json();
    let errors: Vec<String> = validator
        .iter_errors(&body)
        .map(|error| error.to_string())
        .collect();
    assert!(
        errors.is_empty(),
        "{path} answered {status} outside its schema: {errors:?}\n{body}"
    );
}

fn operation_ids(document: &Value) -> BTreeSet<String> {
    document["paths"]
        .as_object()
        .unwrap()
        .values()
        .flat_map(|item| item.as_object().unwrap())
        // A path item's other keys are operations; its shared `parameters` are not.
        .filter(|(key, _)| *key != "parameters")
        .map(|(_, operation)| operation["operationId"].as_str().unwrap().to_owned())
        .collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|name| (*name).to_owned()).collect()
}

const PROTOCOL_OPERATIONS: &[&str] = &[
    "discovery",
    "catalog",
    "openapi",
    "execute",
    "list_executions",
    "get_execution",
    "cancel_execution",
    "execution_events",
    "health",
    "health_live",
    "health_ready",
];

#[tokio::test]
async fn the_documents_of_anonymous_and_internal_callers_match_their_snapshots() {
    let router = shop();
    assert_snapshot(
        "shop_openapi_anonymous.json",
        &openapi_as(&router, None).await,
    );
    assert_snapshot(
        "shop_openapi_internal.json",
        &openapi_as(&router, Some(INTERNAL_TOKEN)).await,
    );
}

#[tokio::test]
async fn each_trust_level_sees_one_operation_per_tool_it_may_call() {
    let router = shop();
    let anonymous_tools = [
        "cancel_order",
        "create_order",
        "generate_report",
        "get_order",
        "list_products",
    ];
    for (token, hidden_visible, manages) in [
        (None, false, false),
        (Some(KNOWN_TOKEN), true, false),
        (Some(INTERNAL_TOKEN), true, true),
    ] {
        let document = openapi_as(&router, token).await;
        assert_eq!(document["openapi"], "3.1.0");
        let catalog = get_as(&router, "/agent/tools", token).await.json();
        let mut expected = set(PROTOCOL_OPERATIONS);
        expected.extend(set(&anonymous_tools));
        if hidden_visible {
            expected.insert("sales_summary".to_owned());
        }
        // Management routes (the configuration reload, and the event subscriptions while
        // events are on, as in the example) are documented for internal callers.
        if manages {
            expected.extend(set(&[
                "admin_reload",
                "list_subscriptions",
                "create_subscription",
                "get_subscription",
                "update_subscription",
                "delete_subscription",
                "rotate_subscription_secret",
                "list_subscription_deliveries",
            ]));
        }
        assert_eq!(operation_ids(&document), expected, "{token:?}");
        assert_eq!(
            document["info"]["version"],
            carmy_tests::sha256_hex(&get_as(&router, "/agent/tools", token).await.body)
        );
        // No second schema source: each operation carries the catalog's own schemas.
        for tool in catalog["tools"].as_array().unwrap() {
            let name = tool["name"].as_str().unwrap();
            let operation = &document["paths"][format!("/agent/tools/{name}")]["post"];
            assert_eq!(operation["operationId"], name);
            assert_eq!(
                operation["requestBody"]["content"]["application/json"]["schema"],
                tool["input_schema"]
            );
            assert_eq!(
                operation["responses"]["200"]["content"]["application/json"]["schema"]["allOf"][1]
                    ["properties"]["data"],
                tool["output_schema"]
            );
            assert_eq!(
                operation["summary"].as_str().unwrap(),
                tool["description"]
                    .as_str()
                    .unwrap()
                    .lines()
                    .next()
                    .unwrap()
            );
            assert_eq!(operation["description"], tool["description"]);
        }
    }
}

#[tokio::test]
async fn every_error_status_is_documented_with_the_envelope() {
    let router = shop();
    let document = openapi_as(&router, None).await;
    let responses = document["components"]["responses"].as_object().unwrap();
    for status in [400, 401, 403, 404, 406, 408, 409, 413, 429, 500, 503, 504] {
        let response = &responses[&format!("Error{status}")];
        assert_eq!(
            response["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/ErrorResponse",
            "{status}"
        );
    }
    let execute = &document["paths"]["/agent/execute"]["post"]["responses"];
    let create_order = &document["paths"]["/agent/tools/create_order"]["post"]["responses"];
    for responses in [execute, create_order] {
        let statuses: BTreeSet<&str> = responses
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            statuses,
            [
                "200", "202", "400", "401", "403", "404", "406", "408", "409", "413", "429", "500",
                "503", "504"
            ]
            .into_iter()
            .collect()
        );
        assert!(
            responses["200"]["content"]["text/event-stream"].is_object(),
            "the SSE variant is documented"
        );
        assert_eq!(
            responses["200"]["headers"]["Carmy-Replayed"]["$ref"],
            "#/components/headers/CarmyReplayed"
        );
    }
    // Tokens are configured: authentication is declared, and optional.
    assert_eq!(document["security"], json!([{}, { "bearer": [] }]));
    assert_eq!(
        document["components"]["securitySchemes"]["bearer"],
        json!({ "type": "http", "scheme": "bearer" })
    );
    // The request id rules as patterns; 64-bit integers with their maximum.
    let schemas = &document["components"]["schemas"];
    assert_eq!(schemas["RequestId"]["pattern"], "^[ -~]{1,256}$");
    assert_eq!(
        schemas["IdempotencyKey"]["pattern"],
        "^[!-~]([ -~]{0,254}[!-~])?$"
    );
    let order_id = &document["paths"]["/agent/tools/get_order"]["post"]["requestBody"]["content"]["application/json"]
        ["schema"]["properties"]["order_id"];
    assert_eq!(order_id["maximum"], json!(u64::MAX));
    assert_eq!(order_id["minimum"], json!(0));
    // The events, with their payloads.
    let webhooks: BTreeSet<&str> = document["webhooks"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        webhooks,
        [
            "execution.finished",
            "health.changed",
            "subscription.disabled",
            "tools.changed"
        ]
        .into_iter()
        .collect()
    );
}

#[tokio::test]
async fn without_tokens_no_security_is_declared() {
    let router = shop::app().router().unwrap();
    let document = openapi_as(&router, None).await;
    assert!(document.get("security").is_none());
    assert!(document["components"].get("securitySchemes").is_none());
    assert!(
        document["paths"]["/agent/execute"]["post"]["responses"]
            .get("401")
            .is_none()
    );
}

#[tokio::test]
async fn the_document_is_served_like_the_catalog() {
    let router = shop();
    let first = get_as(&router, "/agent/openapi.json", None).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("content-type"), Some("application/json"));
    assert_eq!(first.header("cache-control"), Some("private, max-age=60"));
    let etag = first.header("etag").unwrap().to_owned();
    assert_eq!(
        etag,
        format!("\"{}\"", carmy_tests::sha256_hex(&first.body))
    );

    for if_none_match in [etag.clone(), format!("W/{etag}"), "*".to_owned()] {
        let request = Request::get("/agent/openapi.json")
            .header("if-none-match", &if_none_match)
            .body(Body::empty())
            .unwrap();
        let answer = send(&router, request).await;
        assert_eq!(answer.status, StatusCode::NOT_MODIFIED, "{if_none_match}");
        assert!(answer.body.is_empty());
        assert_eq!(answer.header("etag"), Some(etag.as_str()));
    }

    let head = Request::builder()
        .method(Method::HEAD)
        .uri("/agent/openapi.json")
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, head).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.body.is_empty());
    assert_eq!(answer.header("etag"), Some(etag.as_str()));

    // Each level has its own document, and its own validator.
    let internal = get_as(&router, "/agent/openapi.json", Some(INTERNAL_TOKEN)).await;
    assert_ne!(internal.header("etag"), Some(etag.as_str()));
    let stale = Request::get("/agent/openapi.json")
        .header("authorization", bearer(INTERNAL_TOKEN))
        .header("if-none-match", &etag)
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&router, stale).await.status, StatusCode::OK);
}

#[tokio::test]
async fn discovery_announces_the_document() {
    let router = shop::app().router().unwrap();
    let discovery = get(&router, "/.well-known/agent").await.json();
    assert_eq!(discovery["openapi_url"], "/agent/openapi.json");
    assert!(
        discovery["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("openapi"))
    );
}

#[tokio::test]
async fn the_tool_route_answers_like_execute_on_success() {
    let router = shop::app().router().unwrap();
    let arguments = json!({ "sku": "KB-01", "quantity": 2 });
    let execute = send(
        &router,
        execute_request(
            &json!({ "tool": "create_order", "arguments": arguments }),
            &[],
        ),
    )
    .await;
    let tool = send(&router, tool_request("create_order", Some(&arguments), &[])).await;
    let document = openapi_as(&router, None).await;
    assert_documented(&document, "/agent/execute", &execute);
    assert_documented(&document, "/agent/tools/create_order", &tool);
    assert_eq!(tool.status, execute.status);
    assert_eq!(tool.status, StatusCode::OK);
    assert_eq!(tool.header("cache-control"), Some("no-store"));
    assert_eq!(tool.header("content-type"), execute.header("content-type"));
    // The second order: the same pipeline and the same shop.
    let mut expected = without_execution_id(&execute);
    expected["data"]["order_id"] = json!(2);
    assert_eq!(without_execution_id(&tool), expected);

    // An empty body declared JSON is `{}`, as execute's absent `arguments` is.
    let execute = send(
        &router,
        execute_request(&json!({ "tool": "list_products" }), &[]),
    )
    .await;
    let tool = send(&router, tool_request("list_products", None, &[])).await;
    assert_eq!(tool.status, StatusCode::OK);
    assert_eq!(without_execution_id(&tool), without_execution_id(&execute));
}

#[tokio::test]
async fn the_tool_route_answers_like_execute_on_errors() {
    let router = shop();
    let document = openapi_as(&router, None).await;
    let cases = [
        // Confirmation is checked before the arguments: a suggestion to call again never
        // repeats arguments that are no arguments object.
        ("cancel_order", Some(json!([null, null]))),
        // Arguments that break the schema.
        ("create_order", Some(json!({ "sku": 42 }))),
        // A required argument missing, from an empty body.
        ("get_order", None),
        // The tool's own error.
        ("get_order", Some(json!({ "order_id": 99 }))),
        // Confirmation required.
        ("cancel_order", Some(json!({ "order_id": 1 }))),
        // A tool that does not exist, and one the caller may not see: the same answer.
        ("no_such_tool", Some(json!({}))),
        ("sales_summary", Some(json!({}))),
    ];
    for (tool, arguments) in cases {
        let mut body = json!({ "tool": tool });
        if let Some(arguments) = &arguments {
            body["arguments"] = arguments.clone();
        }
        let execute = send(&router, execute_request(&body, &[])).await;
        let routed = send(&router, tool_request(tool, arguments.as_ref(), &[])).await;
        assert_ne!(routed.status, StatusCode::OK, "{tool}");
        assert_eq!(routed.status, execute.status, "{tool}");
        assert_eq!(routed.header("cache-control"), Some("no-store"), "{tool}");
        assert_eq!(
            without_execution_id(&routed),
            without_execution_id(&execute),
            "{tool}"
        );
        assert_documented(&document, "/agent/execute", &execute);
        if document["paths"][format!("/agent/tools/{tool}")].is_object() {
            assert_documented(&document, &format!("/agent/tools/{tool}"), &routed);
        }
    }
    let hidden = send(
        &router,
        tool_request("sales_summary", Some(&json!({})), &[]),
    )
    .await;
    let missing = send(
        &router,
        tool_request("sales_summsry", Some(&json!({})), &[]),
    )
    .await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
    assert_eq!(
        hidden.json()["error"]["code"],
        missing.json()["error"]["code"]
    );
    assert_eq!(hidden.json()["error"]["code"], "TOOL_NOT_FOUND");
}

#[tokio::test]
async fn the_tool_route_refuses_what_execute_refuses() {
    let router = shop::app().router().unwrap();
    let refusals = [
        // Not JSON.
        Request::post("/agent/tools/list_products")
            .header("content-type", "application/json")
            .body(Body::from("{"))
            .unwrap(),
        // Not declared as JSON.
        Request::post("/agent/tools/list_products")
            .header("content-type", "text/plain")
            .body(Body::from("{}"))
            .unwrap(),
        // Empty, and not declared as JSON: a form or a `no-cors` fetch could send it.
        Request::post("/agent/tools/list_products")
            .body(Body::empty())
            .unwrap(),
        Request::post("/agent/tools/list_products")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::empty())
            .unwrap(),
        // A request id that is not printable ASCII.
        tool_request(
            "list_products",
            Some(&json!({})),
            &[("idempotency-key", "é")],
        ),
        // Two different request ids.
        Request::post("/agent/tools/list_products")
            .header("content-type", "application/json")
            .header("idempotency-key", "a")
            .header("idempotency-key", "b")
            .body(Body::empty())
            .unwrap(),
        // A request id over 256 bytes.
        tool_request(
            "list_products",
            Some(&json!({})),
            &[("idempotency-key", &"k".repeat(257))],
        ),
    ];
    for request in refusals {
        let answer = send(&router, request).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
        assert_eq!(answer.json()["error"]["code"], "INVALID_REQUEST");
        assert_eq!(answer.header("cache-control"), Some("no-store"));
    }
    let huge = Request::post("/agent/tools/create_order")
        .header("content-type", "application/json")
        .body(Body::from(format!(
            "{{\"sku\":\"{}\"}}",
            "x".repeat(1024 * 1024)
        )))
        .unwrap();
    let answer = send(&router, huge).await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(answer.json()["error"]["code"], "PAYLOAD_TOO_LARGE");
}

#[tokio::test]
async fn a_repeated_idempotency_key_replays_across_both_routes() {
    let router = shop::app().router().unwrap();
    let key = format!("{}-openapi-replay", carmy_tests::run_id());
    let arguments = json!({ "sku": "KB-01" });
    let first = send(
        &router,
        tool_request(
            "create_order",
            Some(&arguments),
            &[("idempotency-key", &key)],
        ),
    )
    .await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("carmy-replayed"), None);

    let again = send(
        &router,
        tool_request(
            "create_order",
            Some(&arguments),
            &[("idempotency-key", &key)],
        ),
    )
    .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.header("carmy-replayed"), Some("true"));
    assert_eq!(again.body, first.body, "byte-identical");

    // The same call through execute is the same request: replayed too.
    let execute = send(
        &router,
        execute_request(
            &json!({ "tool": "create_order", "arguments": arguments, "request_id": key }),
            &[],
        ),
    )
    .await;
    assert_eq!(execute.header("carmy-replayed"), Some("true"));
    assert_eq!(execute.body, first.body);

    // Other arguments under the same key conflict, as on execute.
    let conflict = send(
        &router,
        tool_request(
            "create_order",
            Some(&json!({ "sku": "MS-01" })),
            &[("idempotency-key", &key)],
        ),
    )
    .await;
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    assert_eq!(conflict.json()["error"]["code"], "IDEMPOTENCY_CONFLICT");
}

#[tokio::test]
async fn the_tool_route_streams_like_execute() {
    let router = shop::app().router().unwrap();
    let arguments = json!({ "seconds": 1 });
    let accept = [("accept", "text/event-stream")];
    let execute = send(
        &router,
        execute_request(
            &json!({ "tool": "generate_report", "arguments": arguments }),
            &accept,
        ),
    )
    .await;
    let tool = send(
        &router,
        tool_request("generate_report", Some(&arguments), &accept),
    )
    .await;
    assert_eq!(tool.status, StatusCode::OK);
    assert_eq!(tool.header("content-type"), Some("text/event-stream"));
    assert_eq!(tool.header("cache-control"), Some("no-store"));
    let events = |answer: &Answer| {
        parse_sse(std::str::from_utf8(&answer.body).unwrap())
            .into_iter()
            .filter(|event| !event.comment)
            .map(|event| {
                let mut data = event.json();
                data.as_object_mut().unwrap().remove("execution_id");
                (event.event.unwrap(), event.id.unwrap(), data)
            })
            .collect::<Vec<_>>()
    };
    let streamed = events(&tool);
    assert_eq!(streamed, events(&execute));
    assert_eq!(streamed.first().unwrap().0, "execution.started");
    assert_eq!(streamed.last().unwrap().0, "execution.completed");
    assert!(streamed.iter().any(|(name, _, _)| name == "tool.progress"));
}

#[tokio::test]
async fn an_undeclared_method_is_405_with_allow() {
    let router = shop::app().router().unwrap();
    for (method, path, allow) in [
        (Method::GET, "/agent/tools/create_order", "POST"),
        (Method::DELETE, "/agent/openapi.json", "GET,HEAD"),
        (Method::PUT, "/agent/execute", "POST"),
        (Method::POST, "/agent/health", "GET,HEAD"),
    ] {
        let answer = send_empty(&router, method.clone(), path).await;
        assert_eq!(
            answer.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_eq!(answer.json()["error"]["code"], "METHOD_NOT_ALLOWED");
        assert_eq!(answer.header("allow"), Some(allow), "{method} {path}");
    }
}

#[tokio::test]
async fn whole_number_floats_are_integers() {
    let router = shop::app().router().unwrap();
    let answer = send(
        &router,
        tool_request(
            "create_order",
            Some(&json!({ "sku": "KB-01", "quantity": 2.0 })),
            &[],
        ),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json());
    let answer = send(
        &router,
        tool_request("get_order", Some(&json!({ "order_id": 1.0 })), &[]),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{:?}", answer.json());
    assert_eq!(answer.json()["data"]["quantity"], json!(2));

    // A fraction is no integer, and neither is a value past the type's maximum.
    for order_id in [json!(1.5), json!(18_446_744_073_709_551_616.0_f64)] {
        let answer = send(
            &router,
            tool_request("get_order", Some(&json!({ "order_id": order_id })), &[]),
        )
        .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST);
        assert_eq!(answer.json()["error"]["code"], "INVALID_ARGUMENTS");
    }
}

/// A folder tree: a recursive type at the root of an input.
#[derive(serde::Deserialize, serde::Serialize, carmy::JsonSchema)]
struct Folder {
    /// The folder's name.
    name: String,
    /// Nested folders.
    #[serde(default)]
    children: Vec<Folder>,
}

/// A recursive type below the root, which schemars puts in `$defs`.
#[derive(serde::Deserialize, serde::Serialize, carmy::JsonSchema)]
struct Drive {
    /// The drive's root folder.
    root: Folder,
}

/// Echoes a folder tree.
#[carmy::tool(effect = "none", register = false)]
async fn echo_folder(input: Folder) -> Result<Folder, carmy::ToolError> {
    Ok(input)
}

/// Echoes a drive.
#[carmy::tool(effect = "none", register = false)]
async fn echo_drive(input: Drive) -> Result<Drive, carmy::ToolError> {
    Ok(input)
}

/// Every `$ref` in `value`.
fn references(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            for (key, field) in fields {
                match field {
                    Value::String(reference) if key == "$ref" => found.push(reference.clone()),
                    _ => references(field, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| references(item, found)),
        _ => {}
    }
}

#[tokio::test]
async fn every_reference_resolves_inside_the_document_recursive_types_included() {
    let router = carmy::App::new()
        .tool(echo_folder::TOOL)
        .tool(echo_drive::TOOL)
        .router()
        .unwrap();
    let catalog = get(&router, "/agent/tools").await.json();
    let document = openapi_as(&router, None).await;
    // The catalog's schemas point into their own `$defs` or at themselves (`#`).
    let mut catalog_references = Vec::new();
    references(&catalog, &mut catalog_references);
    assert!(catalog_references.iter().any(|reference| reference == "#"));
    assert!(
        catalog_references
            .iter()
            .any(|reference| reference.starts_with("#/$defs/"))
    );

    let mut found = Vec::new();
    references(&document, &mut found);
    assert!(!found.is_empty());
    for reference in &found {
        let pointer = reference
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{reference} is not local"));
        assert!(
            pointer.starts_with("/components/"),
            "{reference} points outside the components"
        );
        assert!(
            document.pointer(pointer).is_some(),
            "{reference} does not resolve"
        );
    }
    // The root-recursive input is a component the operation refers to.
    let folder = &document["paths"]["/agent/tools/echo_folder"]["post"]["requestBody"]["content"]["application/json"]
        ["schema"];
    assert_eq!(folder["$ref"], "#/components/schemas/echo_folder.input");
    assert_eq!(
        document["components"]["schemas"]["echo_folder.input"]["properties"]["children"]["items"]["$ref"],
        "#/components/schemas/echo_folder.input"
    );
}

/// Runs one of the OpenAPI tools to its end; fails the test with its output unless it succeeds.
async fn run_tool(program: std::path::PathBuf, args: Vec<String>, dir: &std::path::Path) {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    carmy_tests::run_to_success(program, &args, dir).await;
}

/// The documents validate as OpenAPI 3.1 (`openapi-spec-validator`), and `schemathesis` with
/// every check finds nothing against the running example, as an internal, a known and an
/// anonymous caller. Bounded for CI, with
/// a fixed seed so a run is repeatable; `python3 benches/run.py --only fuzz` runs longer, with
/// fresh seeds and the stateful phase.
///
/// `.ci/run` installs the tools in a virtualenv named by `CARMY_OPENAPI_VENV`, and builds the
/// example named by `CARMY_SHOP_BIN`.
#[tokio::test(flavor = "multi_thread")]
async fn the_example_as_shipped_validates_and_survives_schemathesis() {
    let Some([venv, shop]) = carmy_tests::needs(["CARMY_OPENAPI_VENV", "CARMY_SHOP_BIN"]) else {
        return;
    };
    let bin = std::path::Path::new(&venv).join("bin");
    let shop = carmy_tests::ShippedShop::start(shop.as_ref(), &[]).await;
    let dir = carmy_tests::TempDir::new("openapi-tools");
    let url = format!("http://{}/agent/openapi.json", shop.addr);
    // Internal: every tool, no rate limit. Known: confirmation refused. Anonymous: the shipped
    // 60 calls a minute, so mostly `429`s.
    for (name, token) in [
        ("internal", Some(INTERNAL_TOKEN)),
        ("known", Some(KNOWN_TOKEN)),
        ("anonymous", None),
    ] {
        let mut request = Request::get("/agent/openapi.json").header("host", shop.addr.to_string());
        if let Some(token) = token {
            request = request.header("authorization", bearer(token));
        }
        let answer = carmy_tests::send_to(shop.addr, request.body(Body::empty()).unwrap()).await;
        assert_eq!(answer.status, StatusCode::OK);
        let file = dir.0.join(format!("{name}.json"));
        std::fs::write(&file, &answer.body).unwrap();
        run_tool(
            bin.join("openapi-spec-validator"),
            vec![file.to_string_lossy().into_owned()],
            &dir.0,
        )
        .await;

        let mut args: Vec<String> = [
            "--no-color",
            "run",
            &url,
            "--checks",
            "all",
            "--phases",
            "coverage,fuzzing",
            "--max-examples",
            "10",
            "--seed",
            "20261201",
            "--request-timeout",
            "15",
            // `generate_report` works at most 10 s: any valid call answers within 15 s.
            "--max-response-time",
            "15",
            "--generation-database",
            "none",
            // A subscription made by the fuzzer would send the events of its other calls to
            // whatever address its URL resolves to: these routes are tested by
            // `webhooks.rs` against loopback receivers instead.
            "--exclude-path-regex",
            "^/agent/events/",
        ]
        .map(str::to_owned)
        .into();
        if let Some(token) = token {
            args.extend(["-H".to_owned(), format!("Authorization: {}", bearer(token))]);
        }
        run_tool(bin.join("schemathesis"), args, &dir.0).await;
    }
}
