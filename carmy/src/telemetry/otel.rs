//! OTLP export of carmy's spans (the `otel` feature). carmy's spans are plain `tracing` spans;
//! this module installs `tracing-opentelemetry` with an OTLP/HTTP exporter so they reach a
//! collector under their convention names (`otel.name`) and join the caller's trace.
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//! use tracing_subscriber::util::SubscriberInitExt;
//!
//! # fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // OTEL_EXPORTER_OTLP_ENDPOINT (default http://localhost:4318) and the other OTEL_* variables
//! // configure the exporter.
//! let (otel, export) = carmy::otel::layer("shop")?;
//! tracing_subscriber::registry().with(otel).init();
//! // … serve; dropping `export` sends the spans still buffered.
//! drop(export);
//! # Ok(()) }
//! ```

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use tracing::{Span, Subscriber};
use tracing_opentelemetry::{OpenTelemetryLayer, OpenTelemetrySpanExt};
use tracing_subscriber::registry::LookupSpan;

use super::TraceParent;

pub use opentelemetry_otlp::ExporterBuildError;

/// A `tracing` layer that exports spans over OTLP/HTTP (protobuf) as service `service_name`,
/// and the handle that flushes them: keep it for the life of the program.
pub fn layer<S>(
    service_name: impl Into<String>,
) -> Result<(OpenTelemetryLayer<S, SdkTracer>, OtlpExport), ExporterBuildError>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(service_name.into())
                .build(),
        )
        .build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("carmy"));
    Ok((layer, OtlpExport(provider)))
}

/// Sends the spans still buffered, and stops exporting, when dropped.
#[must_use = "dropping it stops the export"]
#[derive(Debug)]
pub struct OtlpExport(SdkTracerProvider);

impl Drop for OtlpExport {
    fn drop(&mut self) {
        if let Err(error) = self.0.shutdown() {
            tracing::warn!(%error, "could not flush the OTLP span export");
        }
    }
}

/// Makes the caller's span (`traceparent`) the remote parent of `span`.
pub(crate) fn set_parent(span: &Span, parent: &TraceParent) {
    let (Ok(trace_id), Ok(span_id)) = (
        TraceId::from_hex(&parent.trace_id),
        SpanId::from_hex(&parent.parent_id),
    ) else {
        return;
    };
    let flags = if parent.sampled {
        TraceFlags::SAMPLED
    } else {
        TraceFlags::default()
    };
    let remote = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
    // Fails only without an OpenTelemetry layer: then there is no trace to join.
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(remote));
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use opentelemetry::trace::{SpanKind, TracerProvider as _};
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
    use tracing_subscriber::layer::SubscriberExt;

    use crate::telemetry::{TraceParent, execution_span, server_span};

    #[derive(Debug, Clone, Default)]
    struct Collect(Arc<Mutex<Vec<SpanData>>>);

    impl SpanExporter for Collect {
        fn export(
            &self,
            batch: Vec<SpanData>,
        ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
            self.0.lock().unwrap().extend(batch);
            std::future::ready(Ok(()))
        }
    }

    #[test]
    fn exported_spans_join_the_callers_trace_under_their_convention_names() {
        let collect = Collect::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(collect.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let parent =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        tracing::subscriber::with_default(subscriber, || {
            let server = server_span("POST", Some("/agent/execute"), Some(&parent));
            let _entered = server.enter();
            let execution = execution_span("exec_1", None, "echo");
            drop(execution);
        });
        provider.force_flush().unwrap();
        let spans = collect.0.lock().unwrap();
        let server = spans
            .iter()
            .find(|span| span.name == "POST /agent/execute")
            .unwrap_or_else(|| panic!("{spans:#?}"));
        assert_eq!(
            server.span_context.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(server.parent_span_id.to_string(), "00f067aa0ba902b7");
        assert!(server.parent_span_is_remote);
        assert_eq!(server.span_kind, SpanKind::Server);
        let execution = spans
            .iter()
            .find(|span| span.name == "execute_tool echo")
            .unwrap_or_else(|| panic!("{spans:#?}"));
        assert_eq!(execution.parent_span_id, server.span_context.span_id());
        assert_eq!(
            execution.span_context.trace_id(),
            server.span_context.trace_id()
        );
        let attribute = |key: &str| {
            execution
                .attributes
                .iter()
                .find(|attribute| attribute.key.as_str() == key)
                .map(|attribute| attribute.value.to_string())
        };
        assert_eq!(attribute("gen_ai.tool.name").as_deref(), Some("echo"));
        assert_eq!(
            attribute("gen_ai.operation.name").as_deref(),
            Some("execute_tool")
        );
        assert_eq!(attribute("gen_ai.tool.call.id").as_deref(), Some("exec_1"));
    }
}
