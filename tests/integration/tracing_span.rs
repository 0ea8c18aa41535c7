//! Each execution is one `carmy.execution` span with its ids, tool, effect, status, duration and
//! error code, and never the arguments or the output.

use std::sync::{Arc, Mutex};

use carmy_tests::execute;
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

use crate::tools::{self, Probe};

#[derive(Clone, Default)]
struct Recorder {
    lines: Arc<Mutex<Vec<String>>>,
}

struct Fields<'a>(&'a mut String);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!(" {}={:?}", field.name(), value));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let mut line = format!("new {}", attrs.metadata().name());
        attrs.record(&mut Fields(&mut line));
        self.lines.lock().unwrap().push(line);
    }

    fn on_record(&self, _: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut line = "record".to_owned();
        values.record(&mut Fields(&mut line));
        self.lines.lock().unwrap().push(line);
    }

    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut line = "event".to_owned();
        event.record(&mut Fields(&mut line));
        self.lines.lock().unwrap().push(line);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn one_span_per_execution_without_arguments_or_outputs() {
    let recorder = Recorder::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let router = tools::app(&Probe::default()).router().unwrap();
    let answer = execute(&router, &json!({ "tool": "echo", "arguments": { "text": "s3cret-argument" }, "request_id": "trace-1" })).await;
    assert_eq!(answer.json()["data"]["text"], "s3cret-argument");
    execute(&router, &json!({ "tool": "refuse" })).await;

    let lines = recorder.lines.lock().unwrap().join("\n");
    assert!(
        !lines.contains("s3cret"),
        "arguments and outputs stay out of traces:\n{lines}"
    );
    let execution_id = answer.json()["execution_id"].as_str().unwrap().to_owned();
    assert!(lines.contains(&format!("new carmy.execution execution_id=\"{execution_id}\" request_id=\"trace-1\" tool=\"echo\"")), "{lines}");
    for field in [
        "effect=\"none\"",
        "status=\"completed\"",
        "duration_ms=",
        "status=\"failed\"",
        "error_code=\"OUT_OF_STOCK\"",
    ] {
        assert!(lines.contains(field), "{field} missing:\n{lines}");
    }
}
