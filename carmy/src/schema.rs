//! JSON Schemas derived from the tools' Rust types, made safe for model providers
//! (`protocol.md` §2): self-contained, no `$schema` or root `title`, inputs closed to unknown
//! properties, 64-bit integers bounded.

use schemars::Schema;
use schemars::generate::SchemaSettings;
use schemars::transform::{RecursiveTransform, Transform, transform_subschemas};
use serde_json::{Map, Value, json};

use crate::tool::{DescribeInput, DescribeOutput};

/// The input schema of `T`: what the tool deserializes.
#[doc(hidden)]
pub fn input_schema<T: DescribeInput>() -> Value {
    let mut schema = settings()
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<T>();
    CloseObjects.transform(&mut schema);
    RecursiveTransform(bound_integers).transform(&mut schema);
    finish(schema.to_value())
}

/// The output schema of `T`: what the tool serializes.
#[doc(hidden)]
pub fn output_schema<T: DescribeOutput>() -> Value {
    let mut schema = settings()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<T>();
    RecursiveTransform(bound_integers).transform(&mut schema);
    finish(schema.to_value())
}

/// The input schema of a tool without input: an empty object.
#[doc(hidden)]
pub fn no_input_schema() -> Value {
    serde_json::json!({ "type": "object", "properties": {} })
}

fn settings() -> SchemaSettings {
    SchemaSettings::draft2020_12().with(|settings| {
        settings.inline_subschemas = true;
        settings.meta_schema = None;
    })
}

/// Removes what providers reject at the root.
fn finish(mut schema: Value) -> Value {
    if let Value::Object(root) = &mut schema {
        root.remove("$schema");
        root.remove("title");
    }
    schema
}

/// Gives 64-bit integers the bounds of their type: schemars states only the bounds it can be
/// sure of, so without them a value past `u64::MAX` would pass validation and fail
/// deserialization, and a client (or a fuzzer) reading the schema would not know the limit.
fn bound_integers(schema: &mut Schema) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let (minimum, maximum) = match object.get("format").and_then(Value::as_str) {
        Some("uint64" | "uint") => (json!(0), json!(u64::MAX)),
        Some("int64" | "int") => (json!(i64::MIN), json!(i64::MAX)),
        _ => return,
    };
    object.entry("minimum").or_insert(minimum);
    object.entry("maximum").or_insert(maximum);
}

/// Closes every object schema to unknown properties, unless the type set
/// `additionalProperties` itself (that is how an input opts out). schemars' walker knows which
/// keywords hold subschemas, so a property named `default` or `enum` is still a schema and a
/// `default` value is still data.
struct CloseObjects;

impl Transform for CloseObjects {
    fn transform(&mut self, schema: &mut Schema) {
        close(schema, true);
    }
}

const COMPOSITIONS: [&str; 3] = ["allOf", "anyOf", "oneOf"];

/// Closes `schema` (when `here`) and every object below it. An object that also composes
/// subschemas (a `#[serde(flatten)]`ed enum) is closed with `unevaluatedProperties`, which sees
/// the properties its parts declare; those parts are not closed themselves, or each would
/// refuse the others' properties.
fn close(schema: &mut Schema, here: bool) {
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    let parts: Vec<(&str, Value)> = if is_open_object_schema(object) {
        let parts: Vec<_> = COMPOSITIONS
            .into_iter()
            .filter_map(|key| object.remove(key).map(|value| (key, value)))
            .collect();
        let keyword = if parts.is_empty() {
            "additionalProperties"
        } else {
            "unevaluatedProperties"
        };
        if here {
            object.insert(keyword.to_owned(), Value::Bool(false));
        }
        parts
    } else {
        Vec::new()
    };
    transform_subschemas(&mut CloseObjects, schema);
    let Some(object) = schema.as_object_mut() else {
        return;
    };
    for (key, mut value) in parts {
        for part in value.as_array_mut().into_iter().flatten() {
            if let Ok(part) = <&mut Schema>::try_from(part) {
                close(part, false);
            }
        }
        object.insert(key.to_owned(), value);
    }
}

/// An object schema with `properties` whose type did not choose what to do with unknown ones.
fn is_open_object_schema(object: &Map<String, Value>) -> bool {
    // `Option<Struct>` is `"type": ["object", "null"]`.
    let is_object = match object.get("type") {
        Some(Value::String(kind)) => kind == "object",
        Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "object"),
        _ => false,
    };
    is_object
        && object.contains_key("properties")
        && !["additionalProperties", "$ref", "unevaluatedProperties"]
            .iter()
            .any(|key| object.contains_key(*key))
}

/// Whether a root schema is an object schema, as every input schema must be.
pub(crate) fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}
