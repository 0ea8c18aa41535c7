//! Generates `many_tools.rs`: 1,000 registered tools, each with its own input and output type,
//! for the start-up and catalog-build measurements.

use std::fmt::Write;

fn main() {
    let mut code = String::new();
    for n in 0..1_000 {
        write!(
            code,
            r#"
/// Input of tool {n}.
#[derive(serde::Deserialize, carmy::JsonSchema)]
pub(crate) struct Input{n} {{
    /// The id.
    pub(crate) id: u64,
    /// The name.
    pub(crate) name: String,
}}

/// Output of tool {n}.
#[derive(serde::Serialize, carmy::JsonSchema)]
pub(crate) struct Output{n} {{
    /// Whether it worked.
    pub(crate) ok: bool,
}}

/// Tool number {n}.
#[carmy::tool(effect = "read", idempotent = true)]
pub(crate) async fn tool_{n}(input: Input{n}) -> Result<Output{n}, carmy::ToolError> {{
    Ok(Output{n} {{ ok: input.id > 0 && !input.name.is_empty() }})
}}
"#
        )
        .expect("writing to a String never fails");
    }
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(format!("{out}/many_tools.rs"), code).expect("OUT_DIR is writable");
    println!("cargo::rerun-if-changed=build.rs");
}
