//! Tool definitions in the shapes model providers take (`GET /agent/tools?format=…`): OpenAI's
//! strict function calling, Anthropic's `input_schema` and Gemini's OpenAPI subset. Each dialect
//! is narrower than JSON Schema, so the input schema is rewritten to fit. Where a type cannot be
//! said exactly, the definition says something that still validates and the difference is
//! listed as [`Lossy`]; the server keeps validating the original schema, so nothing the
//! narrower definition lets through reaches a tool unchecked.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::principal::TrustLevel;
use crate::tool::{self, ToolDescriptor};

mod gemini;
mod openai;

/// A model provider whose tool-definition shape carmy can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Provider {
    /// OpenAI function calling in strict mode (Chat Completions' `tools` entries).
    OpenAi,
    /// Anthropic's Messages API `tools` entries (`input_schema`).
    Anthropic,
    /// Gemini's `functionDeclarations`, whose `parameters` are an OpenAPI 3.0 schema subset.
    Gemini,
}

impl Provider {
    /// Every provider, in the order their names are listed in errors.
    pub const ALL: [Provider; 3] = [Provider::OpenAi, Provider::Anthropic, Provider::Gemini];

    /// The name used in `?format=` (`"openai"`, `"anthropic"`, `"gemini"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
            Provider::Gemini => "gemini",
        }
    }

    /// Its position in [`Provider::ALL`].
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// The provider called `name` in `?format=`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|provider| provider.as_str() == name)
    }
}

/// One difference between a tool's schema and its provider definition: what the model is told
/// is wider or narrower than what the server accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lossy {
    /// A JSON Pointer into the tool's original input schema.
    pub path: String,
    /// What the provider's dialect could not say.
    pub reason: String,
}

/// A tool's definition for one provider, ready to paste into its API.
#[derive(Debug, Clone)]
pub struct ToolDefinition {
    /// The tool's name.
    pub name: &'static str,
    /// The provider's tool object.
    pub definition: Value,
    /// Where the definition differs from the schema the server validates with.
    pub lossy: Vec<Lossy>,
}

/// The definitions, for `provider`, of the tools registered with `#[carmy::tool]` that a caller
/// trusted at `trust` may see, sorted by name: what `GET /agent/tools?format=…` serves.
pub fn tool_definitions(provider: Provider, trust: TrustLevel) -> Vec<ToolDefinition> {
    let mut tools: Vec<_> = tool::registered()
        .filter(|tool| tool.access <= trust)
        .collect();
    tools.sort_by_key(|tool| tool.name);
    tools.dedup_by_key(|tool| tool.name);
    tools
        .into_iter()
        .map(|tool| tool_definition(provider, tool))
        .collect()
}

/// The definition of one tool for `provider`.
pub fn tool_definition(provider: Provider, tool: &ToolDescriptor) -> ToolDefinition {
    define(
        provider,
        tool.name,
        &super::normalize_doc(tool.description),
        &(tool.input_schema)(),
    )
}

/// The definition of the tool `name`, described by `description`, whose arguments `schema`
/// describes.
pub(crate) fn define(
    provider: Provider,
    name: &'static str,
    description: &str,
    schema: &Value,
) -> ToolDefinition {
    let mut rewrite = Rewrite {
        dialect: provider,
        root: schema,
        defs: schema.get("$defs").and_then(Value::as_object),
        lossy: Vec::new(),
        expanding: Vec::new(),
        closed_objects: false,
    };
    let root = rewrite.flatten_root(schema);
    let definition = match provider {
        Provider::OpenAi => {
            let mut parameters = rewrite.openai(&root, "");
            if let (Some(defs), Value::Object(parameters)) = (rewrite.defs, &mut parameters) {
                let defs = defs
                    .iter()
                    .map(|(key, def)| {
                        let path = format!("/$defs/{}", escape(key));
                        (key.clone(), rewrite.openai(def, &path))
                    })
                    .collect();
                parameters.insert("$defs".to_owned(), Value::Object(defs));
            }
            json!({
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": parameters,
                    "strict": true,
                }
            })
        }
        Provider::Anthropic => json!({
            "name": name,
            "description": description,
            "input_schema": root,
        }),
        Provider::Gemini => {
            let parameters = rewrite.gemini(&root, "");
            if rewrite.closed_objects {
                rewrite.note(
                    "",
                    "unknown properties are refused by the server, not by the schema (no `additionalProperties`)",
                );
            }
            json!({
                "name": name,
                "description": description,
                "parameters": parameters,
            })
        }
    };
    ToolDefinition {
        name,
        definition,
        lossy: rewrite.lossy,
    }
}

/// The keywords every rewrite reads itself.
const STRUCTURAL: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "prefixItems",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "$defs",
    "format",
    "exclusiveMinimum",
    "exclusiveMaximum",
];
/// Keywords that only annotate: dropping them changes what the model reads, not what is valid.
const ANNOTATIONS: &[&str] = &[
    "title",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
    "$schema",
    "$id",
    "contentEncoding",
    "contentMediaType",
];
const COMPOSITIONS: [&str; 3] = ["oneOf", "anyOf", "allOf"];

/// One schema being rewritten for one provider, with what it could not say.
struct Rewrite<'a> {
    dialect: Provider,
    /// The original schema, which `"$ref": "#"` (a recursive input type) names.
    root: &'a Value,
    defs: Option<&'a Map<String, Value>>,
    lossy: Vec<Lossy>,
    /// Gemini: the `$defs` being expanded along the current path (it has no `$ref`).
    expanding: Vec<&'a str>,
    /// Gemini: some object refused unknown properties, which its dialect cannot say.
    closed_objects: bool,
}

impl<'a> Rewrite<'a> {
    fn note(&mut self, path: &str, reason: impl Into<String>) {
        self.lossy.push(Lossy {
            path: path.to_owned(),
            reason: reason.into(),
        });
    }

    /// The subschema a local `$ref` points at, and its name.
    fn resolve(&self, reference: &str) -> Option<(&'a str, &'a Value)> {
        if reference == "#" {
            return Some(("#", self.root));
        }
        let name = reference.strip_prefix("#/$defs/")?;
        self.defs?
            .get_key_value(name)
            .map(|(name, def)| (name.as_str(), def))
    }

    /// Every provider wants a plain object at the root, without `oneOf`/`anyOf`/`allOf` (a
    /// `#[serde(flatten)]`ed enum puts them there): the variants' properties are merged in,
    /// those of only some variants optional and nullable.
    fn flatten_root(&mut self, schema: &Value) -> Value {
        let Some(object) = schema.as_object() else {
            return schema.clone();
        };
        let Some(key) = COMPOSITIONS
            .into_iter()
            .find(|key| object.contains_key(*key))
        else {
            return schema.clone();
        };
        let mut root = object.clone();
        let composed = root.remove(key);
        let variants: Vec<&Map<String, Value>> = composed
            .as_ref()
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(
                |variant| match variant.get("$ref").and_then(Value::as_str) {
                    Some(reference) => self.resolve(reference).and_then(|(_, def)| def.as_object()),
                    None => variant.as_object(),
                },
            )
            .collect();
        let mut properties = root
            .remove("properties")
            .and_then(|properties| properties.as_object().cloned())
            .unwrap_or_default();
        let mut required = string_set(root.get("required"));
        let own: BTreeSet<String> = properties.keys().cloned().collect();
        let in_all = if key == "allOf" {
            variants
                .iter()
                .flat_map(|variant| string_set(variant.get("required")))
                .collect()
        } else {
            variants
                .iter()
                .map(|variant| string_set(variant.get("required")))
                .reduce(|all, next| all.intersection(&next).cloned().collect())
                .unwrap_or_default()
        };
        for variant in &variants {
            for (name, property) in variant
                .get("properties")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
            {
                if own.contains(name) {
                    continue;
                }
                let property = if in_all.contains(name) {
                    property.clone()
                } else {
                    nullable(property)
                };
                match properties.get_mut(name) {
                    Some(existing) if *existing == property => {}
                    Some(existing) => {
                        let first = existing.take();
                        *existing = json!({ "anyOf": [first, property] });
                    }
                    None => {
                        properties.insert(name.clone(), property);
                    }
                }
            }
        }
        required.extend(in_all);
        root.insert("type".to_owned(), json!("object"));
        root.insert("properties".to_owned(), Value::Object(properties));
        root.insert("required".to_owned(), json!(required));
        if root.remove("unevaluatedProperties") == Some(Value::Bool(false)) {
            root.insert("additionalProperties".to_owned(), Value::Bool(false));
        }
        if key != "allOf" {
            self.note(
                &format!("/{key}"),
                "the variants are merged into one object; the server accepts the properties of exactly one variant",
            );
        }
        Value::Object(root)
    }

    /// `true` (any JSON value, e.g. a `serde_json::Value` field): neither OpenAI nor Gemini
    /// can say "anything", so the scalars are offered.
    fn any_value(&mut self, schema: &Value, path: &str) -> Value {
        if *schema != Value::Bool(true) {
            return schema.clone();
        }
        self.note(
            path,
            "any JSON value: described as a string, number or boolean",
        );
        json!({ "anyOf": [{ "type": "string" }, { "type": "number" }, { "type": "boolean" }] })
    }

    /// `anyOf` stays, `oneOf` becomes `anyOf` (the variants of a tagged enum exclude each
    /// other by their tag anyway), a one-part `allOf` is merged in.
    fn compositions(
        &mut self,
        object: &Map<String, Value>,
        path: &str,
        out: &mut Map<String, Value>,
        rewrite: fn(&mut Self, &Value, &str) -> Value,
    ) {
        let mut branches = Vec::new();
        for key in ["anyOf", "oneOf"] {
            for (index, branch) in object
                .get(key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                branches.push(rewrite(self, branch, &format!("{path}/{key}/{index}")));
            }
        }
        if object.contains_key("oneOf") {
            self.note(
                &format!("{path}/oneOf"),
                "`oneOf` becomes `anyOf`: the server still accepts exactly one variant",
            );
        }
        if !branches.is_empty() {
            out.insert("anyOf".to_owned(), Value::Array(branches));
        }
        if let Some(parts) = object.get("allOf").and_then(Value::as_array) {
            if let [only] = parts.as_slice() {
                if let Value::Object(merged) = rewrite(self, only, &format!("{path}/allOf/0")) {
                    for (key, value) in merged {
                        out.entry(key).or_insert(value);
                    }
                }
            } else {
                self.note(&format!("{path}/allOf"), "`allOf` is not supported");
            }
        }
    }

    /// Arrays: `items`, and tuples (`prefixItems`), which neither dialect has.
    fn items(
        &mut self,
        object: &Map<String, Value>,
        path: &str,
        out: &mut Map<String, Value>,
        rewrite: fn(&mut Self, &Value, &str) -> Value,
    ) {
        if let Some(prefix) = object.get("prefixItems").and_then(Value::as_array) {
            self.note(
                &format!("{path}/prefixItems"),
                "tuples are not supported: each position takes any of the tuple's types",
            );
            let mut distinct: Vec<Value> = Vec::new();
            for (index, item) in prefix.iter().enumerate() {
                let item = rewrite(self, item, &format!("{path}/prefixItems/{index}"));
                if !distinct.contains(&item) {
                    distinct.push(item);
                }
            }
            let items = match <[Value; 1]>::try_from(distinct) {
                Ok([only]) => only,
                Err(distinct) => json!({ "anyOf": distinct }),
            };
            out.insert("items".to_owned(), items);
        } else if let Some(items) = object.get("items") {
            out.insert(
                "items".to_owned(),
                rewrite(self, items, &format!("{path}/items")),
            );
        }
    }

    /// Notes what an object's `additionalProperties` said that the rewrite drops: a map's value
    /// schema, or an object open to anything.
    fn closed(&mut self, object: &Map<String, Value>, path: &str) {
        match object
            .get("additionalProperties")
            .or_else(|| object.get("unevaluatedProperties"))
        {
            Some(Value::Bool(false)) => self.closed_objects = true,
            Some(Value::Object(_)) => self.note(
                &format!("{path}/additionalProperties"),
                match self.dialect {
                    Provider::OpenAi => {
                        "a map: strict mode closes every object, so only an empty map can be sent"
                    }
                    _ => "a map: the type of its values is not described",
                },
            ),
            // An input-less tool's `{"properties": {}}` takes `{}` either way.
            _ if self.dialect == Provider::OpenAi
                && object
                    .get("properties")
                    .and_then(Value::as_object)
                    .is_some_and(|properties| !properties.is_empty()) =>
            {
                self.note(
                    path,
                    "an object open to unknown properties: strict mode closes it",
                );
            }
            _ => {}
        }
    }

    /// Copies the keywords in `keep`; notes every other constraint dropped.
    fn keep(
        &mut self,
        object: &Map<String, Value>,
        path: &str,
        keep: &[&str],
        out: &mut Map<String, Value>,
    ) {
        for (key, value) in object {
            if keep.contains(&key.as_str()) {
                out.insert(key.clone(), value.clone());
            } else if !STRUCTURAL.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) {
                self.note(
                    &format!("{path}/{}", escape(key)),
                    format!("`{key}` is not supported"),
                );
            }
        }
    }
}
/// An object with its own properties that also composes variants (a nested
/// `#[serde(flatten)]`ed enum): the same as a choice between the variants, each with the
/// object's own properties added, which the narrower dialects can say.
fn distribute(object: &Map<String, Value>) -> Option<Value> {
    let key = ["oneOf", "anyOf"]
        .into_iter()
        .find(|key| object.contains_key(*key))?;
    let own = object.get("properties")?.as_object()?;
    let required = string_set(object.get("required"));
    let variants = object.get(key)?.as_array()?;
    let mut merged = Vec::with_capacity(variants.len());
    for variant in variants {
        let mut variant = variant.as_object()?.clone();
        let mut properties = own.clone();
        if let Some(Value::Object(extra)) = variant.remove("properties") {
            properties.extend(extra);
        }
        let mut all_required = required.clone();
        all_required.extend(string_set(variant.get("required")));
        variant.insert("type".to_owned(), json!("object"));
        variant.insert("properties".to_owned(), Value::Object(properties));
        variant.insert("required".to_owned(), json!(all_required));
        if object.get("unevaluatedProperties") == Some(&Value::Bool(false)) {
            variant.insert("additionalProperties".to_owned(), Value::Bool(false));
        }
        merged.push(Value::Object(variant));
    }
    let mut choice = Map::new();
    if let Some(description) = object.get("description") {
        choice.insert("description".to_owned(), description.clone());
    }
    choice.insert(key.to_owned(), Value::Array(merged));
    Some(Value::Object(choice))
}

/// Whether `schema` describes an object (by `type` or by having `properties`).
fn is_object(object: &Map<String, Value>) -> bool {
    object.get("type") == Some(&json!("object")) || object.contains_key("properties")
}

/// Whether `null` is valid for `schema` (then an optional property can be sent as `null`).
fn accepts_null(schema: &Value, defs: Option<&Map<String, Value>>) -> bool {
    let Some(object) = schema.as_object() else {
        return *schema == Value::Bool(true);
    };
    let in_type = match object.get("type") {
        Some(Value::String(kind)) => kind == "null",
        Some(Value::Array(kinds)) => kinds.iter().any(|kind| kind == "null"),
        _ => false,
    };
    let in_enum = object
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|values| values.contains(&Value::Null));
    let in_branch = ["anyOf", "oneOf"].into_iter().any(|key| {
        object
            .get(key)
            .and_then(Value::as_array)
            .is_some_and(|branches| branches.iter().any(|branch| accepts_null(branch, defs)))
    });
    let in_ref = object
        .get("$ref")
        .and_then(Value::as_str)
        .and_then(|reference| defs?.get(reference.strip_prefix("#/$defs/")?))
        .is_some_and(|def| accepts_null(def, None));
    in_type || in_enum || in_branch || in_ref
}

/// `schema`, or `null`.
fn nullable(schema: &Value) -> Value {
    json!({ "anyOf": [schema, { "type": "null" }] })
}

fn string_set(value: Option<&Value>) -> BTreeSet<String> {
    value
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// The JSON Schema type of a value, for a `const` without `type`.
fn json_type(value: &Value) -> Option<&'static str> {
    match value {
        Value::String(_) => Some("string"),
        Value::Bool(_) => Some("boolean"),
        Value::Number(number) if number.is_f64() => Some("number"),
        Value::Number(_) => Some("integer"),
        Value::Null => Some("null"),
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// A JSON Pointer token (RFC 6901).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
