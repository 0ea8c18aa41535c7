//! OpenAI's strict function calling: every object closed, every property required.

use serde_json::{Map, Value, json};

use super::{Rewrite, accepts_null, distribute, escape, is_object, json_type, string_set};

/// The keywords OpenAI's strict mode takes besides the structural ones the rewrite sets itself.
const OPENAI_KEEP: &[&str] = &[
    "description",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
];
/// The string formats OpenAI's strict mode knows.
const OPENAI_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

impl Rewrite<'_> {
    /// OpenAI strict mode: every object closed with every property required (optional ones
    /// that accept `null` stay nullable; the others become required), `anyOf` for `oneOf`, and
    /// only the keywords it documents.
    pub(super) fn openai(&mut self, schema: &Value, path: &str) -> Value {
        let Some(object) = schema.as_object() else {
            return self.any_value(schema, path);
        };
        if let Some(reference) = object.get("$ref") {
            return json!({ "$ref": reference });
        }
        if let Some(distributed) = distribute(object) {
            return self.openai(&distributed, path);
        }
        let mut out = Map::new();
        openai_enumeration(object, &mut out);
        if let Some(kind) = object.get("type") {
            out.insert("type".to_owned(), kind.clone());
        }
        self.compositions(object, path, &mut out, Self::openai);
        if is_object(object) {
            let properties = object.get("properties").and_then(Value::as_object);
            let required = string_set(object.get("required"));
            let mut rewritten = Map::new();
            for (name, property) in properties.into_iter().flatten() {
                let property_path = format!("{path}/properties/{}", escape(name));
                if !required.contains(name) && !accepts_null(property, self.defs) {
                    self.note(
                        &property_path,
                        "optional, but strict mode requires every property: always sent",
                    );
                }
                rewritten.insert(name.clone(), self.openai(property, &property_path));
            }
            let names: Vec<&String> = rewritten.keys().collect();
            out.insert("required".to_owned(), json!(names));
            out.insert("properties".to_owned(), Value::Object(rewritten));
            self.closed(object, path);
            out.insert("additionalProperties".to_owned(), Value::Bool(false));
            out.insert("type".to_owned(), json!("object"));
        }
        self.items(object, path, &mut out, Self::openai);
        if let Some(format) = object.get("format").and_then(Value::as_str)
            && OPENAI_FORMATS.contains(&format)
        {
            out.insert("format".to_owned(), json!(format));
        }
        self.keep(object, path, OPENAI_KEEP, &mut out);
        Value::Object(out)
    }
}

/// `enum` and `const` for OpenAI (a `const` is a one-value `enum`).
fn openai_enumeration(object: &Map<String, Value>, out: &mut Map<String, Value>) {
    if let Some(values) = object.get("enum") {
        out.insert("enum".to_owned(), values.clone());
    }
    if let Some(value) = object.get("const") {
        out.insert("enum".to_owned(), json!([value]));
        if !object.contains_key("type")
            && let Some(kind) = json_type(value)
        {
            out.insert("type".to_owned(), json!(kind));
        }
    }
}
