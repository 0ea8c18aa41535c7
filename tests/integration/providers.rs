//! Provider-ready tool definitions (`GET /agent/tools?format=…`, `carmy::catalog`): a table of
//! tricky types checked against each dialect's documented constraints, the lossy notes, and
//! the endpoint's caching, trust levels and errors.

// The input types are read through their schemas only.
#![allow(dead_code)]

use std::collections::HashMap;

use carmy::catalog::{self, Provider, ToolDefinition};
use carmy::{JsonSchema, ToolError, TrustLevel};
use carmy_tests::{get, send};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A tagged enum with data.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Shape {
    Circle { radius: f64 },
    Square { side: u32 },
    Empty,
}

/// An externally tagged enum: a unit variant, a newtype and a struct variant.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) enum Payment {
    Free,
    Cash(u32),
    Card { number: String },
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Address {
    street: String,
    unit: Option<String>,
}

/// A recursive type.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Tree {
    label: String,
    children: Vec<Tree>,
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Tricky {
    /// What to draw.
    shape: Shape,
    payment: Payment,
    /// Nested optionals.
    address: Option<Address>,
    retries: Option<Option<u8>>,
    /// A map.
    tags: HashMap<String, u32>,
    small: u8,
    offset: i16,
    big: u64,
    #[serde(default)]
    count: u32,
    tree: Tree,
    pair: (String, u16),
    #[schemars(length(min = 2, max = 8))]
    code: String,
    extra: serde_json::Value,
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Done {
    ok: bool,
}

/// Takes every tricky type at once.
#[carmy::tool(effect = "none", register = false)]
pub(crate) async fn tricky(input: Tricky) -> Result<Done, ToolError> {
    let _ = input;
    Ok(Done { ok: true })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "by", rename_all = "snake_case")]
pub(crate) enum Target {
    Id { id: u64 },
    Name { name: String },
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Lookup {
    note: String,
    #[serde(flatten)]
    target: Target,
}

/// Finds a thing by id or by name: a flattened enum puts `oneOf` at the root.
#[carmy::tool(effect = "read", register = false)]
pub(crate) async fn lookup(input: Lookup) -> Result<Done, ToolError> {
    let _ = input;
    Ok(Done { ok: true })
}

/// A recursive input: its schema refers to itself (`"$ref": "#"`).
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Folder {
    name: String,
    #[serde(default)]
    children: Vec<Folder>,
}

/// Walks a folder tree.
#[carmy::tool(effect = "none", register = false)]
pub(crate) async fn folders(input: Folder) -> Result<Done, ToolError> {
    let _ = input;
    Ok(Done { ok: true })
}

/// No input at all.
#[carmy::tool(effect = "none", register = false)]
pub(crate) async fn ping() -> Result<Done, ToolError> {
    Ok(Done { ok: true })
}

fn definitions(provider: Provider) -> Vec<ToolDefinition> {
    [tricky::TOOL, lookup::TOOL, folders::TOOL, ping::TOOL]
        .into_iter()
        .map(|tool| catalog::tool_definition(provider, tool))
        .collect()
}

/// Every subschema of `schema` with its JSON Pointer, `schema` first.
fn subschemas<'a>(schema: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    out.push((path.to_owned(), schema));
    let Some(object) = schema.as_object() else {
        return;
    };
    for key in ["properties", "$defs"] {
        for (name, sub) in object
            .get(key)
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            subschemas(sub, &format!("{path}/{key}/{name}"), out);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        for (index, sub) in object
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            subschemas(sub, &format!("{path}/{key}/{index}"), out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(sub) = object.get(key).filter(|sub| sub.is_object()) {
            subschemas(sub, &format!("{path}/{key}"), out);
        }
    }
}

fn all_subschemas(schema: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    subschemas(schema, "", &mut out);
    out
}

fn keys(schema: &Value) -> Vec<&str> {
    schema.as_object().map_or_else(Vec::new, |object| {
        object.keys().map(String::as_str).collect()
    })
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// OpenAI Structured Outputs / strict function calling, as documented: root an object without
/// `anyOf`; every object `additionalProperties: false` with every property required; only the
/// supported keywords and formats; `$ref` alone.
fn check_openai(definition: &Value) {
    assert_eq!(definition["type"], "function");
    let function = &definition["function"];
    assert_eq!(function["strict"], true);
    assert!(valid_name(function["name"].as_str().unwrap()));
    let parameters = &function["parameters"];
    assert_eq!(parameters["type"], "object", "{parameters}");
    assert!(parameters.get("anyOf").is_none(), "{parameters}");
    const ALLOWED: &[&str] = &[
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "anyOf",
        "$ref",
        "$defs",
        "description",
        "pattern",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
    ];
    const FORMATS: &[&str] = &[
        "date-time",
        "time",
        "date",
        "duration",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "uuid",
    ];
    for (path, schema) in all_subschemas(parameters) {
        if path.ends_with("/properties") || path == "/$defs" {
            continue;
        }
        for key in keys(schema) {
            assert!(ALLOWED.contains(&key), "{path}: `{key}` in {schema}");
        }
        if schema.get("$ref").is_some() {
            assert_eq!(keys(schema), ["$ref"], "{path}");
            continue;
        }
        assert!(
            ["type", "anyOf", "enum"]
                .iter()
                .any(|key| schema.get(*key).is_some()),
            "{path}: no type in {schema}"
        );
        if let Some(format) = schema.get("format") {
            assert!(
                FORMATS.contains(&format.as_str().unwrap()),
                "{path}: {format}"
            );
        }
        let is_object = match &schema["type"] {
            Value::String(kind) => kind == "object",
            Value::Array(kinds) => kinds.iter().any(|kind| kind == "object"),
            _ => false,
        };
        if is_object {
            assert_eq!(schema["additionalProperties"], false, "{path}: {schema}");
            let properties: Vec<&str> = keys(&schema["properties"]);
            let mut required: Vec<&str> = schema["required"]
                .as_array()
                .unwrap_or_else(|| panic!("{path}: no required"))
                .iter()
                .map(|name| name.as_str().unwrap())
                .collect();
            required.sort_unstable();
            let mut sorted = properties.clone();
            sorted.sort_unstable();
            assert_eq!(required, sorted, "{path}: every property is required");
        }
    }
    jsonschema::draft202012::new(parameters).expect("a valid JSON Schema");
}

/// Anthropic's `input_schema`: a JSON Schema object without `oneOf`/`anyOf`/`allOf` at its top
/// level.
fn check_anthropic(definition: &Value) {
    assert_eq!(keys(definition), ["name", "description", "input_schema"]);
    assert!(valid_name(definition["name"].as_str().unwrap()));
    let schema = &definition["input_schema"];
    assert_eq!(schema["type"], "object");
    for key in ["oneOf", "anyOf", "allOf"] {
        assert!(schema.get(key).is_none(), "top-level {key}: {schema}");
    }
    jsonschema::draft202012::new(schema).expect("a valid JSON Schema");
}

/// Gemini's `FunctionDeclaration.parameters`: the OpenAPI 3.0 Schema subset it documents: one
/// `type` (no arrays of types: `nullable` instead), string-only enums, no `$ref`, no
/// `additionalProperties`.
fn check_gemini(definition: &Value) {
    assert_eq!(keys(definition), ["name", "description", "parameters"]);
    let parameters = &definition["parameters"];
    assert_eq!(parameters["type"], "object");
    const ALLOWED: &[&str] = &[
        "type",
        "format",
        "title",
        "description",
        "nullable",
        "enum",
        "maxItems",
        "minItems",
        "properties",
        "required",
        "minProperties",
        "maxProperties",
        "minLength",
        "maxLength",
        "pattern",
        "anyOf",
        "propertyOrdering",
        "items",
        "minimum",
        "maximum",
    ];
    const TYPES: &[&str] = &["string", "number", "integer", "boolean", "array", "object"];
    const FORMATS: &[&str] = &["float", "double", "int32", "int64", "date-time", "enum"];
    for (path, schema) in all_subschemas(parameters) {
        if path.ends_with("/properties") {
            continue;
        }
        for key in keys(schema) {
            assert!(ALLOWED.contains(&key), "{path}: `{key}` in {schema}");
        }
        if let Some(kind) = schema.get("type") {
            assert!(
                TYPES.contains(&kind.as_str().unwrap_or_default()),
                "{path}: {kind}"
            );
        } else {
            assert!(schema.get("anyOf").is_some(), "{path}: no type in {schema}");
        }
        if let Some(values) = schema.get("enum") {
            assert_eq!(schema["type"], "string", "{path}");
            assert_eq!(schema["format"], "enum", "{path}");
            assert!(
                values.as_array().unwrap().iter().all(Value::is_string),
                "{path}"
            );
        }
        if let Some(format) = schema.get("format") {
            assert!(
                FORMATS.contains(&format.as_str().unwrap()),
                "{path}: {format}"
            );
        }
        if let Some(required) = schema.get("required") {
            for name in required.as_array().unwrap() {
                assert!(
                    schema["properties"].get(name.as_str().unwrap()).is_some(),
                    "{path}"
                );
            }
        }
        if let Some(order) = schema.get("propertyOrdering") {
            let order: Vec<&str> = order
                .as_array()
                .unwrap()
                .iter()
                .map(|name| name.as_str().unwrap())
                .collect();
            assert_eq!(order, keys(&schema["properties"]), "{path}");
        }
    }
}

#[test]
fn every_definition_fits_its_dialect() {
    for provider in Provider::ALL {
        for definition in definitions(provider) {
            let check = match provider {
                Provider::OpenAi => check_openai,
                Provider::Anthropic => check_anthropic,
                Provider::Gemini => check_gemini,
            };
            check(&definition.definition);
        }
    }
}

/// What each dialect could not say of the tricky types, path by path.
#[test]
fn lossy_notes_name_each_difference() {
    for provider in Provider::ALL {
        for definition in definitions(provider) {
            let notes: Vec<String> = definition
                .lossy
                .iter()
                .map(|lossy| format!("{} {}", lossy.path, lossy.reason))
                .collect();
            println!(
                "{} {}:\n  {}",
                provider.as_str(),
                definition.name,
                notes.join("\n  ")
            );
        }
    }
    let paths = |provider, tool: &str| -> Vec<String> {
        let definition = definitions(provider)
            .into_iter()
            .find(|definition| definition.name == tool)
            .unwrap();
        definition
            .lossy
            .into_iter()
            .map(|lossy| lossy.path)
            .collect()
    };
    assert_eq!(paths(Provider::Anthropic, "tricky"), Vec::<String>::new());
    assert_eq!(paths(Provider::Anthropic, "ping"), Vec::<String>::new());
    assert_eq!(paths(Provider::Anthropic, "lookup"), ["/oneOf"]);
    assert_eq!(paths(Provider::OpenAi, "ping"), Vec::<String>::new());
    assert_eq!(paths(Provider::Gemini, "ping"), Vec::<String>::new());
    let openai = paths(Provider::OpenAi, "tricky");
    for expected in [
        "/properties/count",
        "/properties/tags/additionalProperties",
        "/properties/pair/prefixItems",
        "/properties/code/minLength",
        "/properties/code/maxLength",
        "/properties/extra",
    ] {
        assert!(
            openai.iter().any(|path| path == expected),
            "{expected} not in {openai:?}"
        );
    }
    let gemini = paths(Provider::Gemini, "tricky");
    for expected in [
        "",
        "/properties/tags/additionalProperties",
        "/properties/pair/prefixItems",
        "/properties/extra",
    ] {
        assert!(
            gemini.iter().any(|path| path == expected),
            "{expected} not in {gemini:?}"
        );
    }
    assert!(
        gemini.iter().any(|path| path.contains("/children/items")),
        "the recursion cut is noted: {gemini:?}"
    );
}

/// What the model may send per the definition, the server accepts, where the definition is
/// exact: a full, valid call passes both the provider's schema and the original.
#[test]
fn a_call_valid_for_the_server_is_valid_for_the_definitions() {
    let call = json!({
        "shape": { "kind": "circle", "radius": 1.5 },
        "payment": { "Cash": 3 },
        "address": { "street": "Main", "unit": null },
        "retries": 2,
        "tags": {},
        "small": 255,
        "offset": -3,
        "big": 7,
        "count": 1,
        "tree": { "label": "root", "children": [{ "label": "leaf", "children": [] }] },
        "pair": ["a", 1],
        "code": "ab",
        "extra": "anything",
    });
    let original = jsonschema::draft202012::new(&(tricky::TOOL.input_schema)()).unwrap();
    assert!(
        original.is_valid(&call),
        "{:?}",
        original
            .iter_errors(&call)
            .map(|error| error.to_string())
            .collect::<Vec<_>>()
    );
    for provider in [Provider::OpenAi, Provider::Anthropic] {
        let definition = catalog::tool_definition(provider, tricky::TOOL).definition;
        let schema = match provider {
            Provider::OpenAi => &definition["function"]["parameters"],
            _ => &definition["input_schema"],
        };
        let validator = jsonschema::draft202012::new(schema).unwrap();
        assert!(
            validator.is_valid(&call),
            "{}: {:?}",
            provider.as_str(),
            validator
                .iter_errors(&call)
                .map(|error| error.to_string())
                .collect::<Vec<_>>()
        );
        // A value outside the integer bounds is refused by the definition too.
        let mut out_of_range = call.clone();
        out_of_range["small"] = json!(256);
        assert!(!validator.is_valid(&out_of_range), "{}", provider.as_str());
    }
}

#[test]
fn optionals_become_nullable_and_bounds_stay_for_openai() {
    let definition = catalog::tool_definition(Provider::OpenAi, tricky::TOOL).definition;
    let properties = &definition["function"]["parameters"]["properties"];
    assert_eq!(properties["small"]["minimum"], 0);
    assert_eq!(properties["small"]["maximum"], 255);
    assert_eq!(properties["offset"]["minimum"], -32768);
    assert!(
        properties["small"].get("format").is_none(),
        "uint8 is no OpenAI format"
    );
    // `Option<Address>` accepts null; `count` (a serde default) does not, so it is sent.
    let address = properties["address"].to_string();
    assert!(address.contains("\"null\""), "{address}");
    assert_eq!(properties["count"]["type"], "integer");
    let description = &properties["shape"]["description"];
    assert_eq!(description, "What to draw.");
}

#[test]
fn gemini_says_nullable_and_expands_references() {
    let definition = catalog::tool_definition(Provider::Gemini, tricky::TOOL).definition;
    let properties = &definition["parameters"]["properties"];
    assert_eq!(properties["address"]["type"], "object");
    assert_eq!(properties["address"]["nullable"], true);
    assert_eq!(
        properties["address"]["properties"]["unit"],
        json!({ "type": "string", "nullable": true })
    );
    assert_eq!(properties["retries"]["type"], "integer");
    assert_eq!(properties["retries"]["nullable"], true);
    assert_eq!(
        properties["tree"]["properties"]["children"]["items"]["properties"]["label"]["type"],
        "string"
    );
    assert!(!definition.to_string().contains("$ref"));
    let folders = catalog::tool_definition(Provider::Gemini, folders::TOOL);
    let children = &folders.definition["parameters"]["properties"]["children"];
    assert_eq!(children["items"]["properties"]["name"]["type"], "string");
    assert_eq!(
        folders
            .lossy
            .iter()
            .map(|lossy| lossy.path.as_str())
            .collect::<Vec<_>>(),
        [
            "/properties/children/items/properties/children/items/properties/children/items/properties/children/items",
            ""
        ]
    );
}

#[tokio::test]
async fn the_endpoint_serves_each_format_to_each_trust_level() {
    let router = shop::app().router().unwrap();
    for provider in Provider::ALL {
        let path = format!("/agent/tools?format={}", provider.as_str());
        let answer = get(&router, &path).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let body = answer.json();
        assert_eq!(body["format"], provider.as_str());
        assert!(body["x-carmy-lossy"].is_object());
        let names: Vec<String> = catalog::tool_definitions(provider, TrustLevel::Anonymous)
            .into_iter()
            .filter(|definition| {
                ["create_order", "get_order", "sales_summary"].contains(&definition.name)
            })
            .map(|definition| definition.name.to_owned())
            .collect();
        assert!(names.contains(&"create_order".to_owned()));
        assert!(
            !names.contains(&"sales_summary".to_owned()),
            "hidden from anonymous callers"
        );
        let served = body["tools"].to_string();
        assert!(served.contains("\"create_order\""));
        assert!(!served.contains("sales_summary"), "{served}");

        let etag = answer.header("etag").unwrap().to_owned();
        let plain = get(&router, "/agent/tools").await;
        assert_ne!(plain.header("etag"), Some(etag.as_str()));
        let request = axum::http::Request::get(&path)
            .header("if-none-match", &etag)
            .body(axum::body::Body::empty())
            .unwrap();
        assert_eq!(send(&router, request).await.status, 304);
    }
    // Served from the same catalog as `carmy::catalog`.
    let definitions = catalog::tool_definitions(Provider::Gemini, TrustLevel::Anonymous);
    let served = get(&router, "/agent/tools?format=gemini").await.json();
    let create_order = definitions
        .iter()
        .find(|definition| definition.name == "create_order")
        .unwrap();
    assert!(
        served["tools"]
            .as_array()
            .unwrap()
            .contains(&create_order.definition)
    );
}

#[tokio::test]
async fn an_unknown_format_is_a_json_400() {
    let router = shop::app().router().unwrap();
    for query in [
        "format=openapi",
        "format=",
        "format=openai&format=gemini",
        "format=%FF",
    ] {
        let answer = get(&router, &format!("/agent/tools?{query}")).await;
        assert_eq!(answer.status, 400, "{query}");
        let error = &answer.json()["error"];
        assert_eq!(error["code"], "INVALID_REQUEST", "{query}");
        assert_eq!(
            error["details"]["supported"],
            json!(["openai", "anthropic", "gemini"])
        );
    }
    // Other parameters are ignored, as for the catalog.
    assert_eq!(get(&router, "/agent/tools?page=2").await.status, 200);
}
