//! The example's schemas, snapshotted, and the provider-safety rules of protocol.md §2.
//! Set `CARMY_BLESS=1` to rewrite the snapshot after an intended change (refused where `CI`
//! is set).

use carmy::{JsonSchema, ToolError};
use carmy_tests::get;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const SNAPSHOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/snapshots/shop_catalog.json");

#[tokio::test]
async fn shop_schemas_match_the_snapshot() {
    let router = shop::app().router().unwrap();
    let catalog = get(&router, "/agent/tools").await.json();
    let pretty = serde_json::to_string_pretty(&catalog).unwrap() + "\n";
    carmy_tests::assert_snapshot(SNAPSHOT.as_ref(), &pretty);
}

/// Where `CI` is set, `CARMY_BLESS` fails the test instead of rewriting the snapshot: a
/// snapshot that could rewrite itself would pass any change.
#[test]
fn blessing_a_snapshot_is_refused_in_ci() {
    let output = carmy_tests::run_alone(
        "schemas::shop_schemas_match_the_snapshot",
        &[("CARMY_BLESS", "1"), ("CI", "true")],
        &[],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stdout.contains("CARMY_BLESS would rewrite shop_catalog.json, and CI is set"),
        "{stdout}"
    );
}

fn walk<'a>(schema: &'a Value, found: &mut Vec<(&'a str, &'a Value)>) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map {
                found.push((key.as_str(), value));
                walk(value, found);
            }
        }
        Value::Array(items) => items.iter().for_each(|item| walk(item, found)),
        _ => {}
    }
}

#[tokio::test]
async fn schemas_are_provider_safe() {
    let router = shop::app().router().unwrap();
    let catalog = get(&router, "/agent/tools").await.json();
    for tool in catalog["tools"].as_array().unwrap() {
        for key in ["input_schema", "output_schema"] {
            let schema = &tool[key];
            assert!(schema.get("$schema").is_none(), "{}", tool["name"]);
            assert!(schema.get("title").is_none(), "{}", tool["name"]);
            let mut found = Vec::new();
            walk(schema, &mut found);
            assert!(
                found
                    .iter()
                    .all(|(key, _)| *key != "$ref" && *key != "$defs"),
                "{} is not self-contained",
                tool["name"]
            );
        }
        let input = &tool["input_schema"];
        assert_eq!(input["type"], "object");
        assert!(input["properties"].is_object());
    }
    let list_products = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "list_products")
        .unwrap();
    assert_eq!(
        list_products["input_schema"],
        json!({ "type": "object", "properties": {} })
    );
    let create_order = catalog["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "create_order")
        .unwrap();
    assert_eq!(
        create_order["input_schema"]["additionalProperties"],
        json!(false)
    );
    assert_eq!(
        create_order["input_schema"]["properties"]["sku"]["description"],
        json!("The product to order, e.g. `KB-01`.")
    );
    assert_eq!(
        create_order["input_schema"]["properties"]["quantity"]["minimum"],
        json!(1)
    );
    assert_eq!(
        create_order["input_schema"]["properties"]["quantity"]["default"],
        json!(1)
    );
}

/// A folder tree.
#[derive(Deserialize, Serialize, JsonSchema)]
struct Folder {
    /// The folder's name.
    name: String,
    /// Nested folders.
    #[serde(default)]
    children: Vec<Folder>,
}

/// Counts folders.
#[carmy::tool(effect = "none", register = false)]
async fn count_folders(input: Folder) -> Result<Folder, ToolError> {
    Ok(input)
}

/// Takes any extra properties.
#[derive(Deserialize, JsonSchema)]
#[schemars(extend("additionalProperties" = true))]
struct Open {
    /// A known property.
    known: Option<String>,
}

/// Accepts unknown properties, by choice.
#[carmy::tool(effect = "none", register = false)]
async fn open_input(input: Open) -> Result<bool, ToolError> {
    Ok(input.known.is_some())
}

#[tokio::test]
async fn recursive_types_keep_working() {
    let router = carmy::App::new()
        .tool(count_folders::TOOL)
        .router()
        .unwrap();
    let catalog = get(&router, "/agent/tools").await.json();
    let input = &catalog["tools"][0]["input_schema"];
    assert_eq!(input["type"], "object");
    assert_eq!(input["additionalProperties"], json!(false));
    assert_eq!(input["properties"]["children"]["items"]["$ref"], json!("#"));
    assert!(input.get("title").is_none());
}

#[tokio::test]
async fn an_input_type_can_opt_out_of_closed_objects() {
    let router = carmy::App::new().tool(open_input::TOOL).router().unwrap();
    let catalog = get(&router, "/agent/tools").await.json();
    assert_eq!(
        catalog["tools"][0]["input_schema"]["additionalProperties"],
        json!(true)
    );
}

#[derive(Deserialize, JsonSchema)]
struct Outer {
    inner: Option<Inner>,
}

#[derive(Deserialize, JsonSchema)]
struct Inner {
    value: u8,
}

/// Takes an optional nested struct.
#[carmy::tool(effect = "none", register = false)]
async fn optional_inner(input: Outer) -> Result<bool, ToolError> {
    Ok(input.inner.is_some_and(|inner| inner.value > 0))
}

#[tokio::test]
async fn optional_nested_structs_are_closed_too() {
    let router = carmy::App::new()
        .tool(optional_inner::TOOL)
        .router()
        .unwrap();
    let catalog = get(&router, "/agent/tools").await.json();
    let inner = &catalog["tools"][0]["input_schema"]["properties"]["inner"];
    assert_eq!(inner["additionalProperties"], json!(false), "{inner}");
    let call = async |inner: Value| {
        let body = json!({ "tool": "optional_inner", "arguments": { "inner": inner } });
        carmy_tests::execute(&router, &body).await
    };
    assert_eq!(
        call(json!({ "value": 1 })).await.json()["data"],
        json!(true)
    );
    let refused = call(json!({ "value": 1, "extra": 2 })).await;
    assert_eq!(refused.json()["error"]["code"], "INVALID_ARGUMENTS");
}
