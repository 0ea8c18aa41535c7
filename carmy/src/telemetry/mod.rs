//! What carmy tells operators about itself, without HTTP: Prometheus metrics, and spans named
//! and attributed after the OpenTelemetry GenAI and MCP semantic conventions, joined to the
//! caller's trace by its W3C `traceparent`.

mod metrics;
#[cfg(feature = "otel")]
pub mod otel;
mod spans;

pub(crate) use metrics::{Active, Format, Metrics};
#[cfg(feature = "mcp")]
pub(crate) use spans::mcp_span;
pub(crate) use spans::{TraceParent, execution_span, server_span};
