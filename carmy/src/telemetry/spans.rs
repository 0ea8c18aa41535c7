//! The spans carmy opens, per the OpenTelemetry semantic conventions. A span's convention name
//! (`execute_tool create_order`) depends on the request, which `tracing`'s static names cannot;
//! it goes in `otel.name`, which `tracing-opentelemetry` exports as the span's name.
//!
//! The spans are at DEBUG: a log formatter filtered at INFO, as most are, pays nothing for
//! them per request (formatting their fields cost about half of an execute request's
//! instructions). A subscriber that exports them gives its OpenTelemetry layer a filter of its
//! own that admits them, or none.

use tracing::Span;
use tracing::field::Empty;

use crate::tool_error::clip;

/// A W3C Trace Context `traceparent` (<https://www.w3.org/TR/trace-context/#traceparent-header>):
/// the caller's trace and span, which carmy's spans continue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TraceParent {
    /// 32 lowercase hex digits, not all zero.
    pub(crate) trace_id: String,
    /// 16 lowercase hex digits, not all zero.
    pub(crate) parent_id: String,
    pub(crate) sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` value; `None` for anything malformed, as the specification says
    /// (the request then starts a new trace). A later version's value is read as version 00.
    pub(crate) fn parse(value: &str) -> Option<Self> {
        let value = value.trim();
        let head = value.get(..55)?;
        let rest = &value[55..];
        let mut parts = head.split('-');
        let (version, trace_id, parent_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |part: &str, len: usize| {
            part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let nonzero = |part: &str| part.bytes().any(|b| b != b'0');
        let valid = hex(version, 2)
            && version != "ff"
            && hex(trace_id, 32)
            && nonzero(trace_id)
            && hex(parent_id, 16)
            && nonzero(parent_id)
            && hex(flags, 2)
            // Version 00 is exactly 55 characters; later versions may append `-…`.
            && (rest.is_empty() || (version != "00" && rest.starts_with('-')));
        let flags = u8::from_str_radix(flags, 16).ok()?;
        valid.then(|| TraceParent {
            trace_id: trace_id.to_owned(),
            parent_id: parent_id.to_owned(),
            sampled: flags & 1 == 1,
        })
    }
}

/// The span of one HTTP request (`{method} {route}`, kind server), child of the caller's
/// trace when it sent a `traceparent`. `route`: the matched template, never the raw path.
pub(crate) fn server_span(method: &str, route: Option<&str>, parent: Option<&TraceParent>) -> Span {
    // The fields are built only when the span is enabled.
    let span = tracing::debug_span!(
        "http.server.request",
        otel.name = match route {
            Some(route) => format!("{method} {route}"),
            None => method.to_owned(),
        },
        otel.kind = "server",
        http.request.method = method,
        http.route = route,
        http.response.status_code = Empty,
        trace_id = parent.map(|parent| parent.trace_id.as_str()),
        parent_id = parent.map(|parent| parent.parent_id.as_str()),
    );
    join(&span, parent);
    span
}

/// The span of one MCP request (`{method} {tool}`, e.g. `tools/call create_order`).
#[cfg(feature = "mcp")]
pub(crate) fn mcp_span(method: &str, tool: &str, parent: Option<&TraceParent>) -> Span {
    let tool = clip(tool);
    let span = tracing::debug_span!(
        "mcp.server.request",
        otel.name = format!("{method} {tool}"),
        otel.kind = "server",
        mcp.method.name = method,
        gen_ai.tool.name = &*tool,
        trace_id = parent.map(|parent| parent.trace_id.as_str()),
        parent_id = parent.map(|parent| parent.parent_id.as_str()),
    );
    join(&span, parent);
    span
}

/// The span of one execution (`execute_tool {tool}`): its ids and outcome, never the arguments
/// or the output. `tool` is the name the caller asked for, clipped.
pub(crate) fn execution_span(execution_id: &str, request_id: Option<&str>, tool: &str) -> Span {
    // The fields are built only when the span is enabled: clipped there, not before.
    tracing::debug_span!(
        "execute_tool",
        otel.name = format!("execute_tool {}", clip(tool)),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = clip(tool),
        gen_ai.tool.call.id = execution_id,
        execution_id,
        request_id,
        effect = Empty,
        status = Empty,
        duration_ms = Empty,
        error_code = Empty,
    )
}

/// Makes the caller's span the parent of `span` in the exported trace (the `otel` feature).
#[cfg(feature = "otel")]
fn join(span: &Span, parent: Option<&TraceParent>) {
    if let Some(parent) = parent {
        super::otel::set_parent(span, parent);
    }
}

/// Without an exporter, the caller's ids are only fields of the span.
#[cfg(not(feature = "otel"))]
fn join(_: &Span, _: Option<&TraceParent>) {}

#[cfg(test)]
mod tests {
    use super::TraceParent;

    #[test]
    fn traceparent_forms() {
        let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(valid).unwrap();
        assert_eq!(parsed.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(parsed.parent_id, "00f067aa0ba902b7");
        assert!(parsed.sampled);
        assert!(
            !TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .unwrap()
                .sampled
        );
        // A later version may carry more fields.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra")
                .is_some()
        );
        for invalid in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "0é-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(invalid), None, "{invalid}");
        }
    }
}
