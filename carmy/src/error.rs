//! Errors found while building an app: reported at start-up, never at request time.

/// A mistake in how the app is put together, found by [`App::router`](crate::App::router).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Two tools share a name.
    #[error(
        "two tools are named `{name}`: one at {first}, one at {second}; rename one with `name = \"…\"`"
    )]
    DuplicateTool {
        /// The shared name.
        name: String,
        /// Where the first tool is defined.
        first: String,
        /// Where the second tool is defined.
        second: String,
    },
    /// A tool takes `State<T>` but the app has no value of type `T`.
    #[error(
        "tool `{tool}` ({location}) takes `State<{type_name}>`, but the app has no such state: add `.state(value)` to the builder"
    )]
    MissingState {
        /// The tool.
        tool: String,
        /// Where it is defined.
        location: String,
        /// The missing type.
        type_name: String,
    },
    /// A tool's input schema is not an object schema.
    #[error(
        "tool `{tool}` ({location}) has an input schema that is not an object: its input type must be a struct (or a map) with named fields"
    )]
    InputNotObject {
        /// The tool.
        tool: String,
        /// Where it is defined.
        location: String,
    },
    /// A tool's input schema could not be compiled into a validator.
    #[error("tool `{tool}` ({location}) has an input schema that cannot be compiled: {reason}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// Where it is defined.
        location: String,
        /// The validator's complaint.
        reason: String,
    },
    /// The idempotency record ttl is shorter than a tool's deadline (and the margin to record
    /// its outcome): the record could expire while the tool runs, and a retry run it twice.
    #[error(
        "tool `{tool}` ({location}) may run for {lease:?} (its deadline and a margin to record the outcome), longer than the idempotency record ttl of {ttl:?}: raise `idempotency_ttl` or lower the tool's `timeout`"
    )]
    TtlShorterThanDeadline {
        /// The tool.
        tool: String,
        /// Where it is defined.
        location: String,
        /// The configured record ttl.
        ttl: std::time::Duration,
        /// The tool's deadline and the margin.
        lease: std::time::Duration,
    },
    /// The app's name is empty.
    #[error("the app's name must not be empty")]
    EmptyName,
    /// A token digest is not `sha256:` followed by 64 hex digits.
    #[error(
        "the token of `{id}` must be given as `sha256:<64 hex digits>` (see `carmy::auth::hash_token`), never in clear"
    )]
    InvalidTokenDigest {
        /// The caller the token belongs to.
        id: String,
    },
    /// A token's caller id is the one carmy gives callers without credentials.
    #[error(
        "the token id `{id}` is reserved: carmy calls every caller without credentials `anonymous`; give the token another id"
    )]
    ReservedTokenId {
        /// The id refused.
        id: String,
    },
    /// The configuration (`carmy.toml` or a `CARMY_*` variable) is wrong.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A shared service (the Redis rate limiter) could not be reached or set up.
    #[error("{service} is unavailable: {source}")]
    Unavailable {
        /// What could not be reached.
        service: &'static str,
        /// Why.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Serving failed (binding the address, accepting connections).
    #[error("serving failed: {0}")]
    Io(#[from] std::io::Error),
    /// Serving MCP over stdio failed (the handshake, or the connection).
    #[cfg(feature = "mcp")]
    #[error("serving MCP over stdio failed: {0}")]
    Mcp(String),
}
