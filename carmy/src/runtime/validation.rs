//! Checking arguments against a tool's input schema, and saying what is wrong in a bounded,
//! schema-aware way: messages never echo a large input, and an `enum` or `oneOf` failure names
//! the values the schema allows.

use jsonschema::error::ValidationErrorKind;
use serde_json::{Value, json};

use crate::catalog::CatalogTool;
use crate::tool_error::{ToolError, Violation, clip};
use crate::wire::codes;

/// The most violations listed; the others are counted in `details.omitted`.
const MAX_VIOLATIONS: usize = 10;
/// The most allowed values a message names.
const MAX_ALLOWED: usize = 20;

/// `None` when `arguments` match the tool's input schema; else `INVALID_ARGUMENTS` with at most
/// [`MAX_VIOLATIONS`] bounded violations, or `INTERNAL` when the schema does not compile.
pub(crate) fn check(tool: &CatalogTool, arguments: &Value) -> Option<ToolError> {
    let Ok(validator) = tool.validator() else {
        return Some(ToolError::internal(codes::INTERNAL, "internal error"));
    };
    // The fast check first; the detailed walk only for arguments that fail it.
    if validator.is_valid(arguments) {
        return None;
    }
    let mut errors = validator.iter_errors(arguments);
    let violations: Vec<Violation> = errors
        .by_ref()
        .take(MAX_VIOLATIONS)
        .map(|violation| Violation {
            path: clip(violation.instance_path().as_str()),
            keyword: violation.kind().keyword().to_owned(),
            message: clip(&message(&violation, &tool.input_schema)),
        })
        .collect();
    let omitted = errors.count();
    let details = if omitted == 0 {
        json!({ "errors": violations })
    } else {
        json!({ "errors": violations, "omitted": omitted })
    };
    Some(
        ToolError::validation(
            codes::INVALID_ARGUMENTS,
            "arguments do not match the input schema",
        )
        .details(details),
    )
}

/// The violation's message, with the offending value clipped, and the allowed values named for
/// `enum`, `oneOf` and `anyOf`.
fn message(violation: &jsonschema::ValidationError<'_>, schema: &Value) -> String {
    let instance = violation.instance().to_string();
    let shown = clip(&instance);
    let allowed = match violation.kind() {
        ValidationErrorKind::Enum { options } => options
            .as_array()
            .map(|options| options.iter().map(Value::to_string).collect::<Vec<_>>()),
        ValidationErrorKind::OneOfNotValid { .. } | ValidationErrorKind::AnyOf { .. } => schema
            .pointer(violation.schema_path().as_str())
            .and_then(Value::as_array)
            .and_then(|branches| branches.iter().map(branch_value).collect()),
        _ => None,
    };
    match allowed {
        Some(allowed) => {
            let listed = allowed.len().min(MAX_ALLOWED);
            let mut names = allowed[..listed].join(", ");
            if allowed.len() > listed {
                names.push_str(&format!(", … ({} more)", allowed.len() - listed));
            }
            format!("{shown} is not one of the allowed values: {names}")
        }
        None if shown.len() == instance.len() => violation.to_string(),
        None => violation.masked_with(shown).to_string(),
    }
}

/// What one `oneOf`/`anyOf` branch accepts, when it is a value: a `const`, or an object told
/// apart by a constant tag property (`{"kind": "card"}`). `None` for any other branch.
fn branch_value(branch: &Value) -> Option<String> {
    if let Some(value) = branch.get("const") {
        return Some(value.to_string());
    }
    if let Some([value]) = branch
        .get("enum")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        return Some(value.to_string());
    }
    let (tag, value) = branch
        .get("properties")?
        .as_object()?
        .iter()
        .find_map(|(name, property)| Some((name, property.get("const")?)))?;
    Some(format!("{{\"{tag}\": {value}}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A release build compiles on the first call: a schema that cannot compile fails each
    /// call with `INTERNAL`, never a panic or a call without validation.
    #[test]
    fn a_validator_that_cannot_compile_fails_the_call() {
        let tool = crate::catalog::tests::uncompilable_tool();
        for _ in 0..2 {
            let refused = check(&tool, &json!({"code": "x"})).expect("no call runs unvalidated");
            assert_eq!(refused.code(), "INTERNAL");
        }
    }

    #[test]
    fn branches_name_their_value() {
        assert_eq!(
            branch_value(&json!({"const": "a"})),
            Some("\"a\"".to_owned())
        );
        assert_eq!(branch_value(&json!({"enum": [1]})), Some("1".to_owned()));
        assert_eq!(
            branch_value(&json!({"type": "object", "properties": {"kind": {"const": "card"}}})),
            Some("{\"kind\": \"card\"}".to_owned())
        );
        assert_eq!(branch_value(&json!({"type": "string"})), None);
    }
}
