//! The `#[carmy::tool]` attribute. Use it through the `carmy` crate, which re-exports it and
//! provides everything the generated code refers to.
//!
//! The expansion runs in three steps, one module each: [`ast`] parses the attribute and the
//! function into a model that keeps the original syntax nodes, [`check`] validates the model and
//! collects every error, and [`expand`] generates the registration.

mod ast;
mod attr;
mod check;
mod ctxt;
mod expand;
mod json_schema;
mod symbol;
mod tool_error;

use proc_macro::TokenStream;

/// Turns an `async fn` into a tool that agents can discover and call.
///
/// See the `carmy` crate documentation for the keys and the accepted signatures.
#[proc_macro_attribute]
pub fn tool(args: TokenStream, item: TokenStream) -> TokenStream {
    expand::tool(args.into(), &item.into()).into()
}

/// Derives `carmy::JsonSchema` (schemars' `JsonSchema`) without a `schemars` dependency.
///
/// Accepts the same `#[serde(…)]` and `#[schemars(…)]` attributes as schemars' derive.
#[proc_macro_derive(JsonSchema, attributes(schemars, serde, validate, garde))]
pub fn derive_json_schema(input: TokenStream) -> TokenStream {
    json_schema::derive(input.into()).into()
}

/// Derives `carmy::IntoToolError`: maps an error type to its codes once, so `?` converts it in
/// every tool.
///
/// Each variant (or the struct) takes `#[tool_error(code = "…", category = "…")]`, with
/// optional `message = "…"` (else the `Display` text), `retryable`, `retry_after_secs = N` and
/// `suggest = "tool"`; `#[tool_error(transparent)]` uses a one-field variant's own mapping; a
/// variant without the attribute is `500 INTERNAL`, its `Display` text logged only.
#[proc_macro_derive(ToolError, attributes(tool_error))]
pub fn derive_tool_error(input: TokenStream) -> TokenStream {
    tool_error::derive(input.into()).into()
}
