//! What a tool is at run time: a static descriptor of constants and function pointers, built by
//! `#[carmy::tool]` and registered at link time.

use std::any::TypeId;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Serialize, Serializer};
use serde_json::Value;

use crate::context::{Context, TrustLevel};
use crate::state::StateMap;
use crate::tool_error::ToolError;

/// What calling a tool does to the world. Declared by the tool's author, never inferred.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    /// Computes an answer from its input alone.
    None,
    /// Reads state without changing it.
    Read,
    /// Changes state this service owns.
    Write,
    /// Changes state in another system (sends an email, charges a card).
    ExternalWrite,
    /// Deletes or irreversibly changes state.
    Destructive,
}

impl Effect {
    /// The wire name (`"read"`, `"external_write"`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            Effect::None => "none",
            Effect::Read => "read",
            Effect::Write => "write",
            Effect::ExternalWrite => "external_write",
            Effect::Destructive => "destructive",
        }
    }

    /// `none` and `read` tools change nothing, so running them again is always safe.
    pub const fn is_read_only(self) -> bool {
        matches!(self, Effect::None | Effect::Read)
    }
}

impl Serialize for Effect {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Whether a call needs the user's confirmation, granted on the server side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Confirmation {
    /// The tool runs without confirmation.
    None,
    /// The caller must hold the `confirm:<tool>` permission.
    Required,
}

impl Confirmation {
    /// The wire name (`"none"` or `"required"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Confirmation::None => "none",
            Confirmation::Required => "required",
        }
    }
}

impl Serialize for Confirmation {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Whether a call answers at once with `202 Accepted` and runs detached (`protocol.md` §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Synchronous unless the client sends `Prefer: respond-async`.
    Either,
    /// Always `202 Accepted`: the work outlives any one connection.
    Async,
    /// Never `202`: the preference is ignored.
    Sync,
}

impl Mode {
    /// The wire name (`"either"`, `"async"` or `"sync"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Either => "either",
            Mode::Async => "async",
            Mode::Sync => "sync",
        }
    }
}

impl Serialize for Mode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The future a tool's shim returns.
#[doc(hidden)]
pub type CallFuture = Pin<Box<dyn Future<Output = Result<Output, ToolError>> + Send>>;

/// A tool, as `#[carmy::tool]` describes it: constants and function pointers, so it can live in a
/// `static` and be registered at link time.
///
/// Obtain one with `my_tool::TOOL` and pass it to [`App::tool`](crate::App::tool) to serve a tool
/// declared with `register = false`.
pub struct ToolDescriptor {
    #[doc(hidden)]
    pub name: &'static str,
    #[doc(hidden)]
    pub description: &'static str,
    #[doc(hidden)]
    pub effect: Effect,
    #[doc(hidden)]
    pub idempotent: bool,
    #[doc(hidden)]
    pub parallel_safe: bool,
    #[doc(hidden)]
    pub confirmation: Confirmation,
    #[doc(hidden)]
    pub access: TrustLevel,
    #[doc(hidden)]
    pub timeout: Option<Duration>,
    #[doc(hidden)]
    pub mode: Mode,
    #[doc(hidden)]
    pub input_schema: fn() -> Value,
    #[doc(hidden)]
    pub output_schema: fn() -> Value,
    #[doc(hidden)]
    pub states: &'static [StateRequirement],
    #[doc(hidden)]
    pub call: fn(Invocation) -> CallFuture,
    #[doc(hidden)]
    pub file: &'static str,
    #[doc(hidden)]
    pub line: u32,
}

impl ToolDescriptor {
    /// The tool's name, unique in an app.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The declared effect.
    pub fn effect(&self) -> Effect {
        self.effect
    }

    /// The lowest trust level that may see and call the tool.
    pub fn access(&self) -> TrustLevel {
        self.access
    }

    /// Where the tool is defined, as `file:line`.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

impl fmt::Debug for ToolDescriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolDescriptor")
            .field("name", &self.name)
            .field("effect", &self.effect)
            .field("idempotent", &self.idempotent)
            .field("parallel_safe", &self.parallel_safe)
            .field("confirmation", &self.confirmation)
            .field("access", &self.access)
            .field("timeout", &self.timeout)
            .field("location", &self.location())
            .finish_non_exhaustive()
    }
}

/// A tool registered at link time by `#[carmy::tool]`.
#[doc(hidden)]
#[derive(Debug)]
pub struct Registration(pub &'static ToolDescriptor);

inventory::collect!(Registration);

/// Every tool registered at link time, in no particular order.
pub(crate) fn registered() -> impl Iterator<Item = &'static ToolDescriptor> {
    inventory::iter::<Registration>
        .into_iter()
        .map(|registration| registration.0)
}

/// A `State<T>` parameter of a tool, checked against the app's state when the router is built.
#[doc(hidden)]
#[derive(Debug)]
pub struct StateRequirement {
    pub(crate) type_id: fn() -> TypeId,
    pub(crate) type_name: fn() -> &'static str,
}

impl StateRequirement {
    pub const fn of<T: 'static>() -> Self {
        StateRequirement {
            type_id: TypeId::of::<T>,
            type_name: std::any::type_name::<T>,
        }
    }
}

/// A tool's output, serialized as JSON. A `String`, not a boxed `RawValue`, whose boxing
/// would shrink the buffer serde wrote into, a reallocation on every call.
#[doc(hidden)]
#[derive(Debug)]
pub struct Output(pub(crate) String);

/// Everything a tool's shim needs for one call: the validated arguments, the context and the
/// app's state.
#[doc(hidden)]
pub struct Invocation {
    pub(crate) arguments: Arc<Value>,
    pub(crate) context: Context,
    pub(crate) states: Arc<StateMap>,
}

impl fmt::Debug for Invocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Invocation")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

impl Invocation {
    pub fn context(&self) -> Context {
        self.context.clone()
    }

    pub fn state<T: Clone + Send + Sync + 'static>(&self) -> Result<T, ToolError> {
        self.states.get::<T>().cloned().ok_or_else(|| {
            ToolError::unexpected(format!(
                "state `{}` missing at call time",
                std::any::type_name::<T>()
            ))
        })
    }
}

/// A type a tool can take as its input.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be deserialized as the input of a carmy tool",
    label = "the input type must implement `serde::Deserialize`",
    note = "add `#[derive(serde::Deserialize)]` to `{Self}`"
)]
pub trait DeserializeInput: DeserializeOwned {}

#[diagnostic::do_not_recommend]
impl<T: DeserializeOwned> DeserializeInput for T {}

/// A type whose JSON Schema a tool can advertise as its input.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no JSON Schema to describe the input of a carmy tool",
    label = "the input type must implement `carmy::JsonSchema`",
    note = "add `#[derive(carmy::JsonSchema)]` to `{Self}`"
)]
pub trait DescribeInput: schemars::JsonSchema {}

#[diagnostic::do_not_recommend]
impl<T: schemars::JsonSchema> DescribeInput for T {}

/// A type a tool can return.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be serialized as the output of a carmy tool",
    label = "the output type must implement `serde::Serialize`",
    note = "add `#[derive(serde::Serialize)]` to `{Self}`"
)]
pub trait SerializeOutput: Serialize {}

#[diagnostic::do_not_recommend]
impl<T: Serialize> SerializeOutput for T {}

/// A type whose JSON Schema a tool can advertise as its output.
#[diagnostic::on_unimplemented(
    message = "`{Self}` has no JSON Schema to describe the output of a carmy tool",
    label = "the output type must implement `carmy::JsonSchema`",
    note = "add `#[derive(carmy::JsonSchema)]` to `{Self}`"
)]
pub trait DescribeOutput: schemars::JsonSchema {}

#[diagnostic::do_not_recommend]
impl<T: schemars::JsonSchema> DescribeOutput for T {}

/// An error type a tool can return: [`ToolError`] itself, or any [`IntoToolError`](crate::IntoToolError) type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be converted into `carmy::ToolError`",
    label = "the error type of a carmy tool must convert into `carmy::ToolError`",
    note = "implement `carmy::IntoToolError` for `{Self}` to choose its code and category, \
            or return `carmy::ToolError`"
)]
pub trait ToolResultError: Into<ToolError> {}

#[diagnostic::do_not_recommend]
impl<E: Into<ToolError>> ToolResultError for E {}

/// Deserializes the (already validated) arguments into the tool's input type.
#[doc(hidden)]
pub fn input<T: DeserializeInput>(invocation: &Invocation) -> Result<T, ToolError> {
    T::deserialize(&*invocation.arguments).or_else(|error| {
        // JSON Schema counts `3.0` as an integer, so validation passed it, but serde refuses a
        // float for an integer field: retry with whole-number floats written as integers.
        let mut arguments = (*invocation.arguments).clone();
        if !whole_floats_to_integers(&mut arguments) {
            return Err(ToolError::undecodable_arguments(&error));
        }
        T::deserialize(&arguments).map_err(|_| ToolError::undecodable_arguments(&error))
    })
}

/// Rewrites every whole-number float that fits an `i64` or a `u64` as that integer; true if
/// any was.
fn whole_floats_to_integers(value: &mut Value) -> bool {
    /// 2^64 and -2^63, exact as floats: the ends of the integer range serde can hold.
    const U64_END: f64 = 18_446_744_073_709_551_616.0;
    const I64_START: f64 = -9_223_372_036_854_775_808.0;
    match value {
        Value::Number(number) => {
            let Some(float) = number.as_f64().filter(|_| number.is_f64()) else {
                return false;
            };
            if float.fract() != 0.0 || !(I64_START..U64_END).contains(&float) {
                return false;
            }
            // In range and whole, so the casts are exact.
            *value = if float >= 0.0 {
                Value::from(float as u64)
            } else {
                Value::from(float as i64)
            };
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |changed, item| {
            whole_floats_to_integers(item) | changed
        }),
        Value::Object(fields) => fields.values_mut().fold(false, |changed, field| {
            whole_floats_to_integers(field) | changed
        }),
        _ => false,
    }
}

/// Converts the tool's error, whatever its type, into a [`ToolError`].
#[doc(hidden)]
pub fn ok_or_tool_error<T, E: ToolResultError>(result: Result<T, E>) -> Result<T, ToolError> {
    result.map_err(Into::into)
}

/// Serializes the tool's output; a failure is the tool's bug, reported as `INVALID_OUTPUT`.
#[doc(hidden)]
pub fn serialize_output<T: SerializeOutput>(value: &T) -> Result<Output, ToolError> {
    serde_json::to_string(value)
        .map(Output)
        .map_err(|error| ToolError::invalid_output(&error))
}
