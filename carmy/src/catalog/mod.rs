//! The tools an app serves, checked once at start-up; `carmy.toml`'s per-tool
//! overrides (`[tools.NAME]`) derive a new catalog from it on every reload, sharing the
//! compiled parts. Also their definitions in the shapes model providers take
//! ([`tool_definitions`]), and MCP's tool list.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::Value;

use crate::config::ToolOverride;
use crate::error::Error;
use crate::principal::TrustLevel;
use crate::schema;
use crate::state::StateMap;
use crate::tool::ToolDescriptor;

#[cfg(feature = "mcp")]
pub(crate) mod mcp;
mod providers;

pub(crate) use providers::define;
pub use providers::{Lossy, Provider, ToolDefinition, tool_definition, tool_definitions};

/// The app's tools, sorted by name, with their schemas and compiled validators. Cloning shares
/// the compiled parts.
#[derive(Debug, Clone)]
pub(crate) struct Catalog {
    tools: Vec<CatalogTool>,
    /// Hashed by foldhash rather than SipHash: a lookup on every call, in a map built once from
    /// the registered names, which no caller can add to.
    by_name: HashMap<&'static str, usize, foldhash::fast::RandomState>,
}

/// One tool, ready to describe and to call. Cloning shares the compiled parts.
#[derive(Clone)]
pub(crate) struct CatalogTool {
    pub(crate) descriptor: &'static ToolDescriptor,
    /// The descriptor's name, shared: a call's idempotency fingerprint names its tool without
    /// a copy of its own.
    pub(crate) name: Arc<str>,
    /// The lowest trust level that sees and calls it: the descriptor's, or `[tools.NAME]
    /// access`.
    pub(crate) access: TrustLevel,
    /// Its deadline: the descriptor's, or `[tools.NAME] timeout`; `None` is the app default.
    pub(crate) timeout: Option<Duration>,
    pub(crate) description: Arc<str>,
    pub(crate) input_schema: Arc<Value>,
    /// Derived on first use: only the documents and MCP read it, never a `carmy/1` call.
    output_schema: Arc<OnceLock<Value>>,
    /// The input schema compiled, on the tool's first call in a release build (an app of a
    /// thousand tools starts without compiling a thousand validators), at start-up in a debug
    /// build, so that `cargo run` and the app's tests report a schema that cannot compile.
    validator: Arc<OnceLock<Result<jsonschema::Validator, Error>>>,
}

impl std::fmt::Debug for CatalogTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogTool")
            .field("descriptor", self.descriptor)
            .finish_non_exhaustive()
    }
}

impl Catalog {
    /// Checks the tools against each other and against the app's state, derives their schemas
    /// and compiles their validators.
    pub(crate) fn build(
        descriptors: impl IntoIterator<Item = &'static ToolDescriptor>,
        states: &StateMap,
    ) -> Result<Self, Error> {
        let mut unique: HashMap<&'static str, &'static ToolDescriptor> = HashMap::new();
        for descriptor in descriptors {
            match unique.entry(descriptor.name) {
                Entry::Vacant(slot) => {
                    slot.insert(descriptor);
                }
                // The same tool registered and also added by hand is one tool.
                Entry::Occupied(slot) if std::ptr::eq(*slot.get(), descriptor) => {}
                Entry::Occupied(slot) => {
                    let mut locations = [slot.get().location(), descriptor.location()];
                    locations.sort();
                    let [first, second] = locations;
                    return Err(Error::DuplicateTool {
                        name: descriptor.name.to_owned(),
                        first,
                        second,
                    });
                }
            }
        }
        let mut descriptors: Vec<_> = unique.into_values().collect();
        descriptors.sort_by_key(|descriptor| descriptor.name);

        let tools = descriptors
            .into_iter()
            .map(|descriptor| CatalogTool::build(descriptor, states))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Catalog::index(tools))
    }

    /// This catalog with `carmy.toml`'s per-tool overrides applied: a tool with `enabled =
    /// false` is gone, `access` and `timeout` replace the declared ones. An override naming no
    /// tool is an error naming it.
    pub(crate) fn with_overrides(
        &self,
        overrides: &BTreeMap<String, ToolOverride>,
    ) -> Result<Catalog, Error> {
        if let Some((name, tool)) = overrides.iter().find(|(name, _)| self.get(name).is_none()) {
            return Err(Error::Config(format!(
                "{}: `[tools.{name}]` names no tool this app serves",
                tool.location
            )));
        }
        let tools: Vec<CatalogTool> = self
            .tools
            .iter()
            .filter_map(|tool| match overrides.get(tool.descriptor.name) {
                None => Some(tool.clone()),
                Some(ToolOverride { enabled: false, .. }) => None,
                Some(ToolOverride {
                    enabled: true,
                    access,
                    timeout,
                    location: _,
                }) => Some(CatalogTool {
                    access: access.unwrap_or(tool.access),
                    timeout: timeout.or(tool.timeout),
                    ..tool.clone()
                }),
            })
            .collect();
        Ok(Catalog::index(tools))
    }

    fn index(tools: Vec<CatalogTool>) -> Self {
        let by_name = tools
            .iter()
            .enumerate()
            .map(|(index, tool)| (tool.descriptor.name, index))
            .collect();
        Catalog { tools, by_name }
    }

    /// The tools, sorted by name.
    pub(crate) fn tools(&self) -> &[CatalogTool] {
        &self.tools
    }

    /// The tool called `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&CatalogTool> {
        self.by_name.get(name).map(|&index| &self.tools[index])
    }

    /// The tools a caller trusted at `trust` may see and call, sorted by name.
    pub(crate) fn visible_to(&self, trust: TrustLevel) -> impl Iterator<Item = &CatalogTool> {
        self.tools.iter().filter(move |tool| tool.access <= trust)
    }

    /// The tool called `name`, if a caller trusted at `trust` may see it: a tool above the
    /// caller's level is, to that caller, a tool that does not exist.
    pub(crate) fn get_visible(&self, name: &str, trust: TrustLevel) -> Option<&CatalogTool> {
        self.get(name).filter(|tool| tool.access <= trust)
    }
}

impl Catalog {
    /// The names, among the tools a caller trusted at `trust` may see, nearest to `name` (a
    /// mistyped tool name), best first; at most three.
    pub(crate) fn nearest(&self, name: &str, trust: TrustLevel) -> Vec<&'static str> {
        /// Below this similarity (Jaro-Winkler, 0 to 1) a name is no suggestion.
        const THRESHOLD: f64 = 0.8;
        // Comparing costs the product of the lengths: a name far longer than any tool's is no
        // typo of one.
        if name.len() > 4 * MAX_SUGGESTED_NAME {
            return Vec::new();
        }
        let mut scored: Vec<(f64, &'static str)> = self
            .visible_to(trust)
            .map(|tool| tool.descriptor.name)
            .map(|candidate| (strsim::jaro_winkler(name, candidate), candidate))
            .filter(|&(score, _)| score >= THRESHOLD)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
        scored.into_iter().take(3).map(|(_, name)| name).collect()
    }
}

/// Tool names are short; the nearest-name search ignores names over four times this.
const MAX_SUGGESTED_NAME: usize = 64;

impl CatalogTool {
    fn build(descriptor: &'static ToolDescriptor, states: &StateMap) -> Result<Self, Error> {
        for requirement in descriptor.states {
            if !states.contains((requirement.type_id)()) {
                return Err(Error::MissingState {
                    tool: descriptor.name.to_owned(),
                    location: descriptor.location(),
                    type_name: (requirement.type_name)().to_owned(),
                });
            }
        }
        let input_schema = (descriptor.input_schema)();
        if !schema::is_object_schema(&input_schema) {
            return Err(Error::InputNotObject {
                tool: descriptor.name.to_owned(),
                location: descriptor.location(),
            });
        }
        let validator = OnceLock::new();
        if cfg!(debug_assertions) {
            let _ = validator.set(Ok(compile(descriptor, &input_schema)?));
        }
        Ok(CatalogTool {
            descriptor,
            name: Arc::from(descriptor.name),
            access: descriptor.access,
            timeout: descriptor.timeout,
            description: normalize_doc(descriptor.description).into(),
            input_schema: Arc::new(input_schema),
            output_schema: Arc::default(),
            validator: Arc::new(validator),
        })
    }

    /// The output schema.
    pub(crate) fn output_schema(&self) -> &Value {
        self.output_schema
            .get_or_init(|| (self.descriptor.output_schema)())
    }

    /// The input validator; an error, logged once, when the schema does not compile.
    pub(crate) fn validator(&self) -> Result<&jsonschema::Validator, &Error> {
        self.validator
            .get_or_init(|| {
                compile(self.descriptor, &self.input_schema).inspect_err(|error| {
                    tracing::error!(%error, "the tool cannot be called");
                })
            })
            .as_ref()
    }
}

fn compile(
    descriptor: &ToolDescriptor,
    input_schema: &Value,
) -> Result<jsonschema::Validator, Error> {
    jsonschema::draft202012::new(input_schema).map_err(|error| Error::InvalidSchema {
        tool: descriptor.name.to_owned(),
        location: descriptor.location(),
        reason: error.to_string(),
    })
}

/// Doc comments arrive as lines that each start with the space after `///`: drop that space,
/// keep the line structure, trim the whole.
fn normalize_doc(doc: &str) -> String {
    doc.lines()
        .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
        .collect::<Vec<_>>()
        .join("\n")
        .trim()
        .to_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tool::{Confirmation, Effect, Mode};
    use serde_json::json;

    fn broken_schema() -> Value {
        json!({"type": "object", "properties": {"code": {"type": "string", "pattern": "("}}})
    }

    static BROKEN: ToolDescriptor = ToolDescriptor {
        name: "broken",
        description: "Has a pattern that is no regular expression.",
        effect: Effect::Read,
        idempotent: true,
        parallel_safe: true,
        confirmation: Confirmation::None,
        access: TrustLevel::Anonymous,
        timeout: None,
        mode: Mode::Sync,
        input_schema: broken_schema,
        output_schema: broken_schema,
        states: &[],
        call: |_| unreachable!("never called"),
        file: file!(),
        line: line!(),
    };

    /// A tool whose input schema cannot compile, its validator not yet compiled, as a release
    /// build leaves it until the first call.
    pub(crate) fn uncompilable_tool() -> CatalogTool {
        CatalogTool {
            descriptor: &BROKEN,
            name: Arc::from(BROKEN.name),
            access: TrustLevel::Anonymous,
            timeout: None,
            description: Arc::from(""),
            input_schema: Arc::new(broken_schema()),
            output_schema: Arc::default(),
            validator: Arc::default(),
        }
    }

    /// A release build compiles on the first call: a schema that cannot compile is an error
    /// naming the tool, every time it is asked for.
    #[test]
    fn a_validator_that_cannot_compile_names_its_tool() {
        let tool = uncompilable_tool();
        for _ in 0..2 {
            let error = tool.validator().expect_err("`(` is no regular expression");
            assert!(matches!(error, Error::InvalidSchema { .. }), "{error:?}");
            assert!(error.to_string().contains("`broken`"), "{error}");
        }
    }

    /// A debug build (`cargo run`, the app's tests) finds it at start-up.
    #[test]
    fn a_debug_build_compiles_validators_at_start_up() {
        let built = CatalogTool::build(&BROKEN, &StateMap::default());
        if cfg!(debug_assertions) {
            assert!(matches!(built, Err(Error::InvalidSchema { .. })));
        } else {
            assert!(built.expect("compiled later").validator().is_err());
        }
    }

    #[test]
    fn doc_comments_become_plain_text() {
        assert_eq!(
            normalize_doc(" Place an order.\n\n Longer explanation.\n"),
            "Place an order.\n\nLonger explanation."
        );
        assert_eq!(normalize_doc("  indented code\n"), "indented code");
        assert_eq!(
            normalize_doc("Explicit description"),
            "Explicit description"
        );
    }
}
