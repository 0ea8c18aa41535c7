//! JSON Schemas derived from the tools' Rust types, made safe for model providers
//! (`protocol.md` §2): self-contained, no `$schema` or root `title`, inputs closed to unknown
//! properties.

use schemars::generate::SchemaSettings;
use serde_json::{Map, Value};

use crate::tool::{DescribeInput, DescribeOutput};

/// The input schema of `T`: what the tool deserializes.
#[doc(hidden)]
pub fn input_schema<T: DescribeInput>() -> Value {
    let schema = settings()
        .for_deserialize()
        .into_generator()
        .into_root_schema_for::<T>();
    finish_input(schema.to_value())
}

/// The output schema of `T`: what the tool serializes.
#[doc(hidden)]
pub fn output_schema<T: DescribeOutput>() -> Value {
    let schema = settings()
        .for_serialize()
        .into_generator()
        .into_root_schema_for::<T>();
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

/// [`finish`], then closes every plain object schema to unknown properties, unless the type set
/// `additionalProperties` itself (that is how an input opts out).
fn finish_input(schema: Value) -> Value {
    let mut schema = finish(schema);
    close_objects(&mut schema);
    schema
}

fn close_objects(schema: &mut Value) {
    match schema {
        Value::Object(object) => {
            if is_plain_object_schema(object) {
                object.insert("additionalProperties".to_owned(), Value::Bool(false));
            }
            for (key, value) in object.iter_mut() {
                // Literal values are data, not schemas.
                if !matches!(key.as_str(), "const" | "enum" | "default" | "examples") {
                    close_objects(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(close_objects),
        _ => {}
    }
}

/// An object schema with `properties` and nothing that would make `additionalProperties: false`
/// wrong (composition keywords see properties the object itself does not list).
fn is_plain_object_schema(object: &Map<String, Value>) -> bool {
    object.get("type").and_then(Value::as_str) == Some("object")
        && object.contains_key("properties")
        && ![
            "additionalProperties",
            "allOf",
            "anyOf",
            "oneOf",
            "$ref",
            "unevaluatedProperties",
        ]
        .iter()
        .any(|key| object.contains_key(*key))
}

/// Whether a root schema is an object schema, as every input schema must be.
pub(crate) fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}
