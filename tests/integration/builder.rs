//! `carmy::app()` checks the app at start-up: every mistake is an error from `router()`.

use carmy::{State, ToolError};

/// First tool called `same`.
#[carmy::tool(effect = "read", name = "same", register = false)]
async fn first_same() -> Result<u32, ToolError> {
    Ok(1)
}

/// Second tool called `same`.
#[carmy::tool(effect = "read", name = "same", register = false)]
async fn second_same() -> Result<u32, ToolError> {
    Ok(2)
}

#[tokio::test]
async fn duplicate_names_name_both_locations() {
    let error = carmy::App::new()
        .tool(first_same::TOOL)
        .tool(second_same::TOOL)
        .router()
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, carmy::Error::DuplicateTool { .. }),
        "{error:?}"
    );
    assert!(message.contains("`same`"), "{message}");
    assert!(message.contains(&first_same::TOOL.location()), "{message}");
    assert!(message.contains(&second_same::TOOL.location()), "{message}");
    assert!(
        first_same::TOOL
            .location()
            .starts_with("tests/integration/builder.rs:")
    );
}

#[tokio::test]
async fn missing_state_names_the_type_and_the_tool() {
    let error = carmy::App::new()
        .tool(shop::create_order::TOOL)
        .router()
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, carmy::Error::MissingState { .. }),
        "{error:?}"
    );
    assert!(message.contains("`create_order`"), "{message}");
    assert!(message.contains("State<shop::Shop>"), "{message}");

    let _router = carmy::App::new()
        .tool(shop::create_order::TOOL)
        .state(shop::Shop::new())
        .router()
        .expect("the state is there");
}

/// Takes a list: not an object.
#[carmy::tool(effect = "read", register = false)]
async fn takes_a_list(input: Vec<String>) -> Result<usize, ToolError> {
    Ok(input.len())
}

#[tokio::test]
async fn a_non_object_input_schema_is_refused() {
    let error = carmy::App::new()
        .tool(takes_a_list::TOOL)
        .router()
        .unwrap_err();
    assert!(
        matches!(error, carmy::Error::InputNotObject { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("`takes_a_list`"), "{error}");
}

#[derive(serde::Deserialize, carmy::JsonSchema)]
struct Coupon {
    #[schemars(regex(pattern = "("))]
    code: String,
}

/// Takes a coupon whose pattern is no regular expression.
#[carmy::tool(effect = "read", register = false)]
async fn redeem(input: Coupon) -> Result<usize, ToolError> {
    Ok(input.code.len())
}

/// A test build compiles every validator at start-up (a release build, on each tool's first
/// call: the catalog's unit tests).
#[tokio::test]
async fn an_input_schema_that_cannot_compile_is_refused_in_a_debug_build() {
    let error = carmy::App::new().tool(redeem::TOOL).router().unwrap_err();
    assert!(
        matches!(error, carmy::Error::InvalidSchema { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("`redeem`"), "{error}");
}

#[tokio::test]
async fn an_empty_name_is_refused() {
    let error = carmy::App::new().name("  ").router().unwrap_err();
    assert!(matches!(error, carmy::Error::EmptyName), "{error:?}");
}

#[derive(Clone)]
struct Counter(u32);

/// Reads the counter.
#[carmy::tool(effect = "read", register = false)]
async fn read_counter(State(counter): State<Counter>) -> Result<u32, ToolError> {
    Ok(counter.0)
}

#[tokio::test]
async fn unregistered_tools_are_served_only_when_added() {
    // `register = false` keeps the tool out of `carmy::app()`.
    let registered = carmy_tests::get(&shop::app().router().unwrap(), "/agent/tools").await;
    assert!(!String::from_utf8_lossy(&registered.body).contains("read_counter"));

    let router = carmy::App::new()
        .tool(read_counter::TOOL)
        .state(Counter(7))
        .router()
        .unwrap();
    let catalog = carmy_tests::get(&router, "/agent/tools").await.json();
    assert_eq!(catalog["tools"][0]["name"], "read_counter");
    assert_eq!(catalog["tools"].as_array().unwrap().len(), 1);
}
