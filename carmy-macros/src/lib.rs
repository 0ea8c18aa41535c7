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
