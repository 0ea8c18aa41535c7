//! Arbitrary bytes and arbitrary JSON at `/agent/execute`: never a panic, never plain text,
//! always one of the protocol's statuses.

use axum::body::Body;
use axum::http::Request;
use carmy_tests::send;
use proptest::prelude::*;
use serde_json::{Value, json};

use crate::tools::{self, Probe};

const STATUSES: &[u16] = &[200, 400, 403, 404, 405, 408, 409, 413, 429, 500, 503, 504];

fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("echo"),
            Just("count"),
            Just("wipe"),
            Just("explode"),
            Just("tool"),
            Just("arguments"),
            Just("request_id")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("tool".to_owned()),
                    Just("arguments".to_owned()),
                    Just("request_id".to_owned()),
                    Just("text".to_owned()),
                    ".{0,6}"
                ],
                inner,
                0..4,
            )
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn check(bytes: Vec<u8>, stream: bool) -> Result<(), TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let router = tools::app(&Probe::default()).router().unwrap();
        let mut request =
            Request::post("/agent/execute").header("content-type", "application/json");
        if stream {
            request = request.header("accept", "text/event-stream");
        }
        let answer = send(&router, request.body(Body::from(bytes)).unwrap()).await;
        prop_assert!(
            STATUSES.contains(&answer.status.as_u16()),
            "status {}",
            answer.status
        );
        match answer.header("content-type") {
            Some("application/json") => {
                prop_assert!(
                    serde_json::from_slice::<Value>(&answer.body).is_ok(),
                    "body is JSON"
                );
            }
            Some("text/event-stream") => {
                let events = carmy_tests::parse_sse(std::str::from_utf8(&answer.body).unwrap());
                let last = events.last().unwrap();
                prop_assert_eq!(last.event.as_deref(), Some("execution.completed"));
                prop_assert!(serde_json::from_str::<Value>(last.data.as_deref().unwrap()).is_ok());
            }
            other => prop_assert!(false, "content type {other:?}"),
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256), stream in any::<bool>()) {
        check(bytes, stream)?;
    }

    #[test]
    fn arbitrary_json_bodies(body in arbitrary_json(), stream in any::<bool>()) {
        check(body.to_string().into_bytes(), stream)?;
    }

    #[test]
    fn arbitrary_calls(tool in prop_oneof![Just("echo"), Just("count"), Just("picky"), Just("refuse"), Just("nope")], arguments in arbitrary_json(), request_id in proptest::option::of(".{0,8}")) {
        let mut body = json!({ "tool": tool, "arguments": arguments });
        if let Some(request_id) = request_id {
            body["request_id"] = json!(request_id);
        }
        check(body.to_string().into_bytes(), false)?;
    }
}
