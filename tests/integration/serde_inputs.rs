//! Inputs that use serde's attributes (also through `cfg_attr`): the schema says what serde
//! accepts, the defaults of a `#[serde(default)]` container reach the tool, and unknown fields
//! are refused at every depth, also under a property named `default`, `enum` or `const`.

use axum::http::StatusCode;
use carmy::{JsonSchema, ToolError};
use carmy_tests::{execute, get};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A container default: omitted fields take `Search::default()`'s values.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(default, rename_all = "camelCase")]
struct Search {
    query_text: String,
    #[cfg_attr(test, serde(rename = "limit"))]
    page_size: u32,
    #[serde(flatten)]
    paging: Paging,
    #[serde(skip)]
    cache_key: Option<u64>,
    #[cfg(not(test))]
    compiled_out: NotAType,
    #[cfg(test)]
    compiled_in: bool,
}

impl Default for Search {
    fn default() -> Self {
        Search {
            query_text: "*".to_owned(),
            page_size: 25,
            paging: Paging { offset: 0 },
            cache_key: None,
            compiled_in: true,
        }
    }
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct Paging {
    offset: u64,
}

/// Properties named like JSON Schema keywords, each holding an object.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct Keywords {
    default: Inner,
    #[serde(rename = "enum")]
    enumeration: Inner,
    #[serde(rename = "const")]
    constant: Inner,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct Inner {
    value: u32,
}

/// A flattened enum: its variants' fields sit next to the struct's own.
#[derive(Debug, Deserialize, Serialize, JsonSchema)]
struct Shipment {
    address: String,
    #[serde(flatten)]
    method: Method,
}

#[derive(Debug, Deserialize, Serialize, JsonSchema)]
#[serde(tag = "method", rename_all = "snake_case")]
enum Method {
    Pickup { store: String },
    Courier { express: bool },
}

/// Echoes what it received.
#[carmy::tool(effect = "none", register = false)]
async fn ship(input: Shipment) -> Result<Shipment, ToolError> {
    Ok(input)
}

/// Echoes what it received.
#[carmy::tool(effect = "none", register = false)]
async fn search(input: Search) -> Result<Search, ToolError> {
    assert!(input.cache_key.is_none());
    Ok(input)
}

/// Echoes what it received.
#[carmy::tool(effect = "none", register = false)]
async fn keywords(input: Keywords) -> Result<Keywords, ToolError> {
    Ok(input)
}

fn router() -> axum::Router {
    carmy::App::new()
        .tool(search::TOOL)
        .tool(keywords::TOOL)
        .tool(ship::TOOL)
        .router()
        .unwrap()
}

async fn input_schema(tool: &str) -> Value {
    let catalog = get(&router(), "/agent/tools").await.json();
    catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["name"] == tool)
        .unwrap()["input_schema"]
        .clone()
}

#[tokio::test]
async fn the_schema_says_what_serde_accepts() {
    let schema = input_schema("search").await;
    assert_eq!(schema["additionalProperties"], false);
    let mut properties: Vec<&str> = schema["properties"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    properties.sort_unstable();
    assert_eq!(properties, ["compiledIn", "limit", "offset", "queryText"]);
    assert_eq!(schema["properties"]["limit"]["default"], 25);
    assert_eq!(schema["properties"]["queryText"]["default"], "*");
    assert!(schema.get("required").is_none_or(|required| {
        required
            .as_array()
            .unwrap()
            .iter()
            .all(|name| name == "offset")
    }));

    let schema = input_schema("keywords").await;
    for key in ["default", "enum", "const"] {
        assert_eq!(
            schema["properties"][key]["additionalProperties"], false,
            "{key}: {schema}"
        );
    }
}

#[tokio::test]
async fn a_containers_defaults_reach_the_tool() {
    let answer = execute(
        &router(),
        &json!({ "tool": "search", "arguments": { "limit": 5, "offset": 10 } }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());
    assert_eq!(
        answer.json()["data"],
        json!({ "queryText": "*", "limit": 5, "offset": 10, "compiledIn": true })
    );
}

#[tokio::test]
async fn unknown_fields_are_refused_at_every_depth() {
    let inner = json!({ "value": 1 });
    let valid = json!({ "default": inner, "enum": inner, "const": inner });
    let answer = execute(
        &router(),
        &json!({ "tool": "keywords", "arguments": valid }),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.json());

    for (tool, arguments) in [
        ("search", json!({ "page_size": 5 })),
        ("search", json!({ "cache_key": 5 })),
        ("search", json!({ "compiled_out": 1 })),
        (
            "keywords",
            json!({ "default": { "value": 1, "extra": 2 }, "enum": inner, "const": inner }),
        ),
        (
            "keywords",
            json!({ "default": inner, "enum": { "value": 1, "extra": 2 }, "const": inner }),
        ),
        (
            "keywords",
            json!({ "default": inner, "enum": inner, "const": { "value": 1, "extra": 2 } }),
        ),
    ] {
        let answer = execute(&router(), &json!({ "tool": tool, "arguments": arguments })).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{arguments}");
        let error = &answer.json()["error"];
        assert_eq!(error["code"], "INVALID_ARGUMENTS", "{arguments}");
        assert_eq!(error["category"], "validation", "{arguments}");
    }
}

#[tokio::test]
async fn a_flattened_enum_accepts_its_fields_and_nothing_else() {
    for valid in [
        json!({ "address": "1 Main St", "method": "pickup", "store": "north" }),
        json!({ "address": "1 Main St", "method": "courier", "express": true }),
    ] {
        let answer = execute(&router(), &json!({ "tool": "ship", "arguments": valid })).await;
        assert_eq!(answer.status, StatusCode::OK, "{valid}: {}", answer.json());
        assert_eq!(answer.json()["data"], valid);
    }
    for invalid in [
        json!({ "address": "1 Main St", "method": "pickup", "store": "north", "extra": 1 }),
        json!({ "address": "1 Main St", "method": "pickup", "store": "north", "express": true }),
        json!({ "address": "1 Main St", "method": "teleport" }),
    ] {
        let answer = execute(&router(), &json!({ "tool": "ship", "arguments": invalid })).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{invalid}");
        assert_eq!(
            answer.json()["error"]["code"],
            "INVALID_ARGUMENTS",
            "{invalid}"
        );
    }
}
