//! `GET /agent/tools` (protocol.md §2, §3).

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use carmy::ToolError;
use carmy_tests::{get, send};
use serde_json::json;

#[tokio::test]
async fn catalog_lists_the_tools_by_name_with_their_metadata() {
    let router = shop::app().router().unwrap();
    let answer = get(&router, "/agent/tools").await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(answer.header("cache-control"), Some("private, max-age=60"));
    assert_eq!(
        answer.header("etag").unwrap(),
        format!("\"{}\"", carmy_tests::sha256_hex(&answer.body))
    );

    let catalog = answer.json();
    let tools = catalog["tools"].as_array().unwrap();
    let names: Vec<_> = tools
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "cancel_order",
            "create_order",
            "generate_report",
            "get_order",
            "list_products"
        ]
    );
    let metadata: Vec<_> = tools
        .iter()
        .map(|tool| {
            json!([
                tool["name"],
                tool["effect"],
                tool["idempotent"],
                tool["parallel_safe"],
                tool["confirmation"]
            ])
        })
        .collect();
    assert_eq!(
        metadata,
        [
            json!(["cancel_order", "destructive", true, true, "required"]),
            json!(["create_order", "write", false, true, "none"]),
            json!(["generate_report", "none", false, true, "none"]),
            json!(["get_order", "read", true, true, "none"]),
            json!(["list_products", "read", true, true, "none"]),
        ]
    );
    assert_eq!(
        tools[1]["description"],
        json!(
            "Place an order.\n\nTakes the units from stock. Not idempotent: send a `request_id` so a retry cannot order twice."
        )
    );
}

#[tokio::test]
async fn catalog_entries_keep_the_protocol_field_order() {
    let router = shop::app().router().unwrap();
    let answer = get(&router, "/agent/tools").await;
    let text = std::str::from_utf8(&answer.body).unwrap();
    let entry = &text[text.find("{\"name\":\"create_order\"").unwrap()..];
    let positions: Vec<_> = [
        "\"name\"",
        "\"description\"",
        "\"input_schema\"",
        "\"output_schema\"",
        "\"effect\"",
        "\"idempotent\"",
        "\"parallel_safe\"",
        "\"confirmation\"",
    ]
    .iter()
    .map(|field| entry.find(field).unwrap())
    .collect();
    assert!(
        positions.windows(2).all(|pair| pair[0] < pair[1]),
        "{positions:?}"
    );
    assert!(text.starts_with("{\"tools\":[{\"name\":\"cancel_order\""));
}

#[tokio::test]
async fn if_none_match_forms_give_304() {
    let router = shop::app().router().unwrap();
    let etag = get(&router, "/agent/tools")
        .await
        .header("etag")
        .unwrap()
        .to_owned();
    for value in [
        etag.clone(),
        format!("W/{etag}"),
        "*".to_owned(),
        format!("\"stale\", {etag}"),
        format!("\"stale\",W/{etag}"),
    ] {
        let request = Request::get("/agent/tools")
            .header("if-none-match", &value)
            .body(Body::empty())
            .unwrap();
        let answer = send(&router, request).await;
        assert_eq!(answer.status, StatusCode::NOT_MODIFIED, "{value}");
        assert!(answer.body.is_empty(), "{value}");
        assert_eq!(answer.header("etag"), Some(etag.as_str()), "{value}");
        assert_eq!(
            answer.header("cache-control"),
            Some("private, max-age=60"),
            "{value}"
        );
    }
    for value in ["\"stale\"", "\"stale\", \"older\"", "W/\"stale\"", ""] {
        let request = Request::get("/agent/tools")
            .header("if-none-match", value)
            .body(Body::empty())
            .unwrap();
        let answer = send(&router, request).await;
        assert_eq!(answer.status, StatusCode::OK, "{value}");
        assert!(!answer.body.is_empty(), "{value}");
    }
}

#[tokio::test]
async fn head_gives_the_headers_without_the_body() {
    let router = shop::app().router().unwrap();
    let full = get(&router, "/agent/tools").await;
    let request = Request::builder()
        .method(Method::HEAD)
        .uri("/agent/tools")
        .body(Body::empty())
        .unwrap();
    let answer = send(&router, request).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert!(answer.body.is_empty());
    assert_eq!(answer.header("etag"), full.header("etag"));
    assert_eq!(answer.header("cache-control"), Some("private, max-age=60"));
}

/// Reads a value.
#[carmy::tool(effect = "read", register = false)]
async fn extra_tool() -> Result<u32, ToolError> {
    Ok(1)
}

/// Reads a value, described differently.
#[carmy::tool(effect = "read", name = "extra_tool", register = false)]
async fn extra_tool_reworded() -> Result<u32, ToolError> {
    Ok(1)
}

async fn versions(app: carmy::App) -> (String, String) {
    let router = app.router().unwrap();
    let discovery = get(&router, "/.well-known/agent").await;
    let catalog = get(&router, "/agent/tools").await;
    (
        discovery.json()["tools_version"]
            .as_str()
            .unwrap()
            .to_owned(),
        catalog.header("etag").unwrap().to_owned(),
    )
}

#[tokio::test]
async fn tools_version_changes_when_and_only_when_the_catalog_changes() {
    let (base, base_etag) = versions(shop::app()).await;
    // Same tools: same version, across builds and whatever the server's name.
    assert_eq!(versions(shop::app()).await.0, base);
    assert_eq!(versions(shop::app().name("renamed")).await.0, base);
    assert_eq!(versions(shop::app().name("renamed")).await.1, base_etag);
    // The same tool added by hand on top of registration is still the same catalog.
    assert_eq!(
        versions(shop::app().tool(shop::list_products::TOOL))
            .await
            .0,
        base
    );

    // One more tool: another version.
    let (more, more_etag) = versions(shop::app().tool(extra_tool::TOOL)).await;
    assert_ne!(more, base);
    assert_ne!(more_etag, base_etag);
    // A tool whose description changed: another version again.
    let (reworded, _) = versions(shop::app().tool(extra_tool_reworded::TOOL)).await;
    assert_ne!(reworded, more);
    assert_ne!(reworded, base);
}
