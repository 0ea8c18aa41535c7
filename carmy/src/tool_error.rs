//! The one error type of carmy's protocol: a stable code, a category (which decides the HTTP
//! status), and what an agent can do about it.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use axum::http::StatusCode;
use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::Value;

/// What kind of failure an error is. Decides the HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// The call is wrong: fix it (400).
    Validation,
    /// The caller may not do this (403).
    Permission,
    /// Something named in the call does not exist (404).
    NotFound,
    /// The call clashes with the current state (409).
    Conflict,
    /// The execution was cancelled (408).
    Cancelled,
    /// The server failed (500).
    Internal,
    /// The server is busy or a limit was reached (503).
    Capacity,
    /// The execution ran past its deadline (504).
    Timeout,
}

impl Category {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::Validation => "validation",
            Category::Permission => "permission",
            Category::NotFound => "not_found",
            Category::Conflict => "conflict",
            Category::Cancelled => "cancelled",
            Category::Internal => "internal",
            Category::Capacity => "capacity",
            Category::Timeout => "timeout",
        }
    }

    /// The category whose wire name is `name` (how stores read back what they wrote).
    pub fn from_wire(name: &str) -> Option<Self> {
        [
            Category::Validation,
            Category::Permission,
            Category::NotFound,
            Category::Conflict,
            Category::Cancelled,
            Category::Internal,
            Category::Capacity,
            Category::Timeout,
        ]
        .into_iter()
        .find(|category| category.as_str() == name)
    }
}

pub(crate) use crate::wire::codes;

/// An error a tool returns, or the runtime produces, as agents see it.
///
/// ```
/// use carmy::ToolError;
/// use std::time::Duration;
///
/// let error = ToolError::conflict("OUT_OF_STOCK", "MS-01 is out of stock")
///     .suggest("list_products")
///     .details(serde_json::json!({ "sku": "MS-01" }));
/// let busy = ToolError::capacity("WAREHOUSE_BUSY", "try again shortly")
///     .retryable(Duration::from_secs(2));
/// ```
///
/// A tool's own error type converts with `?` once it implements [`IntoToolError`] (or derives
/// it with `#[derive(carmy::ToolError)]`); io, serde, `String` and `anyhow` errors convert into
/// an `internal` error whose text is logged while the agent sees a generic message.
pub struct ToolError {
    inner: Box<Inner>,
}

struct Inner {
    code: Cow<'static, str>,
    message: Cow<'static, str>,
    category: Category,
    recoverable: bool,
    retryable: bool,
    retry_after: Option<Duration>,
    suggested_action: Option<Cow<'static, str>>,
    details: Option<Value>,
    /// What went wrong inside, for the logs only.
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
    /// Set when the arguments could not be decoded: the tool never ran.
    rejected_before_running: bool,
}

macro_rules! constructors {
    ($($(#[$doc:meta])* $name:ident => $category:ident, recoverable: $recoverable:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(
                code: impl Into<Cow<'static, str>>,
                message: impl Into<Cow<'static, str>>,
            ) -> Self {
                Self::new(Category::$category, code, message).recoverable($recoverable)
            }
        )*
    };
}

impl ToolError {
    /// An error of any category. Prefer the per-category constructors.
    pub fn new(
        category: Category,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<Cow<'static, str>>,
    ) -> Self {
        ToolError {
            inner: Box::new(Inner {
                code: code.into(),
                message: message.into(),
                category,
                recoverable: false,
                retryable: false,
                retry_after: None,
                suggested_action: None,
                details: None,
                source: None,
                rejected_before_running: false,
            }),
        }
    }

    constructors! {
        /// The call is wrong; the agent can fix it (400).
        validation => Validation, recoverable: true;
        /// The caller may not do this (403).
        permission => Permission, recoverable: false;
        /// Something the call names does not exist (404); the agent can correct it.
        not_found => NotFound, recoverable: true;
        /// The call clashes with the current state (409).
        conflict => Conflict, recoverable: true;
        /// The execution was cancelled (408).
        cancelled => Cancelled, recoverable: false;
        /// The server failed (500).
        internal => Internal, recoverable: false;
        /// The server is busy or a limit was reached (503); usually retryable.
        capacity => Capacity, recoverable: false;
        /// The execution ran out of time (504).
        timeout => Timeout, recoverable: false;
    }

    /// Marks the error as retryable: the same call may succeed later, after `after` if known.
    #[must_use]
    pub fn retryable(mut self, after: impl Into<Option<Duration>>) -> Self {
        self.inner.retryable = true;
        self.inner.retry_after = after.into();
        self
    }

    /// Whether the agent can succeed by changing its call.
    #[must_use]
    pub fn recoverable(mut self, recoverable: bool) -> Self {
        self.inner.recoverable = recoverable;
        self
    }

    /// Suggests a tool that helps the agent recover (for example `list_products`).
    #[must_use]
    pub fn suggest(mut self, tool: impl Into<Cow<'static, str>>) -> Self {
        self.inner.suggested_action = Some(tool.into());
        self
    }

    /// Machine-readable details for the agent.
    #[must_use]
    pub fn details(mut self, details: Value) -> Self {
        self.inner.details = Some(details);
        self
    }

    /// Keeps an underlying error for the logs; it is never sent to the client.
    #[must_use]
    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        self.inner.source = Some(source.into());
        self
    }

    /// The stable code, e.g. `OUT_OF_STOCK`.
    pub fn code(&self) -> &str {
        &self.inner.code
    }

    /// The message shown to the agent.
    pub fn message(&self) -> &str {
        &self.inner.message
    }

    /// The category.
    pub fn category(&self) -> Category {
        self.inner.category
    }

    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        self.inner.retryable
    }

    /// Whether the agent can succeed by changing its call.
    pub fn is_recoverable(&self) -> bool {
        self.inner.recoverable
    }

    /// How long to wait before retrying, when known.
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.retry_after
    }

    /// The suggested tool, if any.
    pub fn suggested_action(&self) -> Option<&str> {
        self.inner.suggested_action.as_deref()
    }

    /// The details, if any.
    pub fn details_value(&self) -> Option<&Value> {
        self.inner.details.as_ref()
    }

    /// The logged-only source, if any.
    pub fn source(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.inner.source.as_deref()
    }

    pub(crate) fn is_rejected_before_running(&self) -> bool {
        self.inner.rejected_before_running
    }

    /// `400 INVALID_REQUEST` with `details.reason`: the request itself is malformed.
    pub(crate) fn invalid_request(reason: impl Into<String>) -> Self {
        Self::validation(codes::INVALID_REQUEST, "the request is malformed")
            .details(serde_json::json!({ "reason": reason.into() }))
    }

    /// `500 INTERNAL` for a failure the agent can do nothing about: `error` goes to the logs,
    /// the agent sees "internal error". `.map_err(ToolError::unexpected)?` maps any error this
    /// way where it occurs.
    pub fn unexpected(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::internal(codes::INTERNAL, "internal error").with_source(error)
    }

    /// Arguments that passed the schema but that the input type refused.
    pub(crate) fn undecodable_arguments(error: &serde_json::Error) -> Self {
        let mut error = Self::validation(
            codes::INVALID_ARGUMENTS,
            "arguments do not match the input schema",
        )
        .details(serde_json::json!({
            "errors": [Violation {
                path: String::new(),
                keyword: "deserialize".to_owned(),
                message: clip(&error.to_string()),
            }]
        }));
        error.inner.rejected_before_running = true;
        error
    }

    /// An output the tool's type could not serialize.
    pub(crate) fn invalid_output(error: &serde_json::Error) -> Self {
        Self::internal(
            codes::INVALID_OUTPUT,
            "the tool produced an output that could not be serialized",
        )
        .with_source(error.to_string())
    }
}

impl fmt::Debug for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolError")
            .field("code", &self.inner.code)
            .field("category", &self.inner.category)
            .field("message", &self.inner.message)
            .field("retryable", &self.inner.retryable)
            .field("source", &self.inner.source)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.inner.code, self.inner.message)
    }
}

/// An error type that knows which [`ToolError`] it is. Implement it once on your error type (or
/// `#[derive(carmy::ToolError)]`), and `?` converts it in every tool, as does returning
/// `Result<T, YourError>` from a tool.
///
/// ```
/// use carmy::{IntoToolError, ToolError};
///
/// enum StockError {
///     OutOfStock(String),
///     Database(std::io::Error),
/// }
///
/// impl IntoToolError for StockError {
///     fn into_tool_error(self) -> ToolError {
///         match self {
///             StockError::OutOfStock(sku) => {
///                 ToolError::conflict("OUT_OF_STOCK", format!("{sku} is out of stock"))
///             }
///             StockError::Database(error) => ToolError::unexpected(error),
///         }
///     }
/// }
/// ```
///
/// carmy implements it for the errors a tool meets without choosing a code: `std::io::Error`,
/// `serde_json::Error`, `String`, `&str`, `Box<dyn Error + Send + Sync>` and, with the `anyhow`
/// feature, `anyhow::Error`. They become `500 INTERNAL`: the text is logged, never sent.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be converted into `carmy::ToolError`",
    label = "`carmy::IntoToolError` is not implemented for `{Self}`",
    note = "implement `carmy::IntoToolError` for `{Self}` to choose its code and category \
            (a `std::error::Error` can also be mapped where it occurs, as an internal error, \
            with `.map_err(carmy::ToolError::unexpected)?`)"
)]
pub trait IntoToolError {
    /// The error as agents see it.
    fn into_tool_error(self) -> ToolError;
}

/// What makes `?` work in tools: every [`IntoToolError`] type converts.
impl<E: IntoToolError> From<E> for ToolError {
    fn from(error: E) -> Self {
        error.into_tool_error()
    }
}

/// Errors that carry no code of their own: internal, logged only.
macro_rules! unexpected_errors {
    ($($(#[$meta:meta])* $ty:ty),* $(,)?) => {
        $(
            $(#[$meta])*
            impl IntoToolError for $ty {
                fn into_tool_error(self) -> ToolError {
                    ToolError::unexpected(self)
                }
            }
        )*
    };
}

unexpected_errors! {
    std::io::Error,
    serde_json::Error,
    String,
    &str,
    Box<dyn std::error::Error + Send + Sync>,
    #[cfg(feature = "anyhow")]
    #[cfg_attr(docsrs, doc(cfg(feature = "anyhow")))]
    anyhow::Error,
}

impl IntoToolError for std::convert::Infallible {
    fn into_tool_error(self) -> ToolError {
        match self {}
    }
}

/// The wire form (`protocol.md` §4): never includes the source.
impl Serialize for ToolError {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Inner {
            code,
            message,
            category,
            recoverable,
            retryable,
            retry_after,
            suggested_action,
            details,
            source: _,
            rejected_before_running: _,
        } = &*self.inner;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("code", code)?;
        map.serialize_entry("message", message)?;
        map.serialize_entry("category", category.as_str())?;
        map.serialize_entry("recoverable", recoverable)?;
        map.serialize_entry("retryable", retryable)?;
        if let Some(after) = retry_after {
            map.serialize_entry("retry_after", &retry_after_secs(*after))?;
        }
        if let Some(tool) = suggested_action {
            map.serialize_entry("suggested_action", tool)?;
        }
        if let Some(details) = details {
            map.serialize_entry("details", details)?;
        }
        map.end()
    }
}

/// One way the arguments break the input schema (`details.errors[]`), fields in the
/// protocol's order.
#[derive(Debug, Serialize)]
pub(crate) struct Violation {
    /// JSON pointer into the arguments.
    pub(crate) path: String,
    pub(crate) keyword: String,
    pub(crate) message: String,
}

/// How much of a value, a name or a message an error echoes, in bytes.
pub(crate) const MAX_ECHO: usize = 256;

/// The status an error is answered with (`protocol.md` §4's table, a courtesy to generic HTTP
/// clients): the category's, except for codes HTTP has a more precise status for.
pub(crate) fn status_of(error: &ToolError) -> StatusCode {
    status_for(Some(error.category()), Some(error.code()))
}

/// The status of an answer: `200` without an error, else by category and code.
pub(crate) fn status_for(category: Option<Category>, code: Option<&str>) -> StatusCode {
    match code {
        Some(crate::wire::codes::PAYLOAD_TOO_LARGE) => return StatusCode::PAYLOAD_TOO_LARGE,
        Some(crate::wire::codes::METHOD_NOT_ALLOWED) => return StatusCode::METHOD_NOT_ALLOWED,
        Some(crate::wire::codes::UNAUTHENTICATED) => return StatusCode::UNAUTHORIZED,
        Some(crate::wire::codes::RATE_LIMITED) => return StatusCode::TOO_MANY_REQUESTS,
        Some(crate::wire::codes::UNSUPPORTED_VERSION) => return StatusCode::NOT_ACCEPTABLE,
        _ => {}
    }
    let Some(category) = category else {
        return StatusCode::OK;
    };
    match category {
        Category::Validation => StatusCode::BAD_REQUEST,
        Category::Permission => StatusCode::FORBIDDEN,
        Category::NotFound => StatusCode::NOT_FOUND,
        Category::Conflict => StatusCode::CONFLICT,
        Category::Cancelled => StatusCode::REQUEST_TIMEOUT,
        Category::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        Category::Capacity => StatusCode::SERVICE_UNAVAILABLE,
        Category::Timeout => StatusCode::GATEWAY_TIMEOUT,
    }
}

/// `text`, cut at [`MAX_ECHO`] bytes (on a character boundary) with `…` when longer.
pub(crate) fn clip(text: &str) -> String {
    if text.len() <= MAX_ECHO {
        return text.to_owned();
    }
    let mut end = MAX_ECHO;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Whole seconds to wait, rounded up so a client never retries too early.
pub(crate) fn retry_after_secs(after: Duration) -> u64 {
    u64::try_from(after.as_millis().div_ceil(1000)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_short_text_and_cuts_long_text_on_a_character() {
        assert_eq!(clip("short"), "short");
        let long = "é".repeat(MAX_ECHO);
        let clipped = clip(&long);
        assert!(clipped.len() <= MAX_ECHO + '…'.len_utf8());
        assert!(clipped.ends_with('…'));
    }
}
