//! Gemini's OpenAPI subset: no `$ref`, one `type` with `nullable`, string-only enums.

use serde_json::{Map, Value, json};

use super::{Rewrite, distribute, escape, is_object, string_set};

/// The keywords Gemini's schema takes besides the structural ones the rewrite sets itself.
const GEMINI_KEEP: &[&str] = &[
    "description",
    "title",
    "pattern",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
];
/// The formats Gemini's schema knows.
const GEMINI_FORMATS: &[&str] = &["float", "double", "int32", "int64", "date-time", "enum"];
/// How many times Gemini's rewrite expands one recursive type along a path before cutting it.
const GEMINI_RECURSION: usize = 3;

impl Rewrite<'_> {
    /// Gemini: no `$ref` (recursive types are expanded a few levels, then cut), one `type`
    /// with `nullable`, string-only enums, `anyOf` for `oneOf`, no `additionalProperties`.
    pub(super) fn gemini(&mut self, schema: &Value, path: &str) -> Value {
        let Some(object) = schema.as_object() else {
            return self.any_value(schema, path);
        };
        if let Some(reference) = object.get("$ref").and_then(Value::as_str) {
            let Some((name, def)) = self.resolve(reference) else {
                self.note(path, "a reference outside the schema cannot be expanded");
                return json!({ "type": "object" });
            };
            let depth = self.expanding.iter().filter(|open| **open == name).count();
            if depth >= GEMINI_RECURSION {
                self.note(
                    path,
                    format!("a recursive type: described {GEMINI_RECURSION} levels deep only"),
                );
                return json!({ "type": "object", "nullable": true });
            }
            self.expanding.push(name);
            let mut expanded = self.gemini(def, path);
            self.expanding.pop();
            if let (Some(description), Value::Object(expanded)) =
                (object.get("description"), &mut expanded)
            {
                expanded.insert("description".to_owned(), description.clone());
            }
            return expanded;
        }
        if let Some(distributed) = distribute(object) {
            return self.gemini(&distributed, path);
        }
        // `["T", "null"]` and `anyOf: [S, {"type": "null"}]` are Gemini's `nullable`.
        let mut object = object.clone();
        let mut nullable = false;
        if let Some(Value::Array(kinds)) = object.get("type") {
            let kinds: Vec<Value> = kinds
                .iter()
                .filter(|kind| *kind != "null")
                .cloned()
                .collect();
            nullable = kinds.len() < object["type"].as_array().map_or(0, Vec::len);
            match kinds.as_slice() {
                [one] => {
                    object.insert("type".to_owned(), one.clone());
                }
                _ => {
                    object.remove("type");
                    let branches = kinds.iter().map(|kind| json!({ "type": kind })).collect();
                    object.insert("anyOf".to_owned(), Value::Array(branches));
                }
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = object.get(key) {
                let kept: Vec<Value> = branches
                    .iter()
                    .filter(|branch| **branch != json!({ "type": "null" }))
                    .cloned()
                    .collect();
                if kept.len() < branches.len() {
                    nullable = true;
                    if let [only] = kept.as_slice() {
                        object.remove(key);
                        let mut merged = only.as_object().cloned().unwrap_or_default();
                        if let Some(description) = object.get("description") {
                            merged.insert("description".to_owned(), description.clone());
                        }
                        let mut rewritten = self.gemini(&Value::Object(merged), path);
                        if let Value::Object(rewritten) = &mut rewritten {
                            rewritten.insert("nullable".to_owned(), Value::Bool(true));
                        }
                        return rewritten;
                    }
                    object.insert(key.to_owned(), Value::Array(kept));
                }
            }
        }
        let mut out = Map::new();
        if let Some(kind) = object.get("type") {
            out.insert("type".to_owned(), kind.clone());
        }
        self.gemini_enumeration(&object, path, &mut out);
        if nullable {
            out.insert("nullable".to_owned(), Value::Bool(true));
        }
        self.compositions(&object, path, &mut out, Self::gemini);
        if is_object(&object) {
            let mut rewritten = Map::new();
            for (name, property) in object
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                let property_path = format!("{path}/properties/{}", escape(name));
                rewritten.insert(name.clone(), self.gemini(property, &property_path));
            }
            let required: Vec<String> = string_set(object.get("required"))
                .into_iter()
                .filter(|name| rewritten.contains_key(name))
                .collect();
            if !rewritten.is_empty() {
                let order: Vec<&String> = rewritten.keys().collect();
                out.insert("propertyOrdering".to_owned(), json!(order));
                out.insert("properties".to_owned(), Value::Object(rewritten));
            }
            if !required.is_empty() {
                out.insert("required".to_owned(), json!(required));
            }
            self.closed(&object, path);
            out.insert("type".to_owned(), json!("object"));
        }
        self.items(&object, path, &mut out, Self::gemini);
        if let Some(format) = object.get("format").and_then(Value::as_str)
            && GEMINI_FORMATS.contains(&format)
        {
            out.insert("format".to_owned(), json!(format));
        }
        self.keep(&object, path, GEMINI_KEEP, &mut out);
        let integer = object.get("type") == Some(&json!("integer"));
        for (bound, inclusive, step) in [
            ("exclusiveMinimum", "minimum", 1),
            ("exclusiveMaximum", "maximum", -1),
        ] {
            let Some(value) = object.get(bound) else {
                continue;
            };
            match value.as_i64().filter(|_| integer) {
                // For integers, `> n` is `>= n + 1`.
                Some(bound) => {
                    out.insert(inclusive.to_owned(), json!(bound + step));
                }
                None => self.note(
                    &format!("{path}/{bound}"),
                    format!("`{bound}` is not supported"),
                ),
            }
        }
        Value::Object(out)
    }

    /// Gemini's enums are strings only, marked with `format: "enum"`; a `null` among them is
    /// `nullable`.
    fn gemini_enumeration(
        &mut self,
        object: &Map<String, Value>,
        path: &str,
        out: &mut Map<String, Value>,
    ) {
        let (key, mut values) = match (object.get("enum"), object.get("const")) {
            (Some(Value::Array(values)), _) => ("enum", values.clone()),
            (None, Some(value)) => ("const", vec![value.clone()]),
            _ => return,
        };
        let count = values.len();
        values.retain(|value| !value.is_null());
        if values.len() < count {
            out.insert("nullable".to_owned(), Value::Bool(true));
        }
        if values.iter().all(Value::is_string) {
            out.insert("type".to_owned(), json!("string"));
            out.insert("format".to_owned(), json!("enum"));
            out.insert("enum".to_owned(), Value::Array(values));
        } else {
            self.note(
                &format!("{path}/{key}"),
                "only string enums are supported: the allowed values are not listed",
            );
        }
    }
}
