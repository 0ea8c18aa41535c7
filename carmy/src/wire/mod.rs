//! The names carmy puts on the wire, in one place: error codes and header names and values.

use axum::http::{HeaderName, HeaderValue};

pub(crate) mod headers;

/// Codes carmy itself produces (`protocol.md` §4, README "Errors"). Tools choose their own.
pub(crate) mod codes {
    pub(crate) const INVALID_REQUEST: &str = "INVALID_REQUEST";
    pub(crate) const PAYLOAD_TOO_LARGE: &str = "PAYLOAD_TOO_LARGE";
    /// A request body that did not arrive within the body timeout (`408`).
    pub(crate) const REQUEST_TIMEOUT: &str = "REQUEST_TIMEOUT";
    pub(crate) const ROUTE_NOT_FOUND: &str = "ROUTE_NOT_FOUND";
    pub(crate) const METHOD_NOT_ALLOWED: &str = "METHOD_NOT_ALLOWED";
    pub(crate) const INTERNAL: &str = "INTERNAL";
    pub(crate) const TOOL_NOT_FOUND: &str = "TOOL_NOT_FOUND";
    pub(crate) const INVALID_ARGUMENTS: &str = "INVALID_ARGUMENTS";
    pub(crate) const INVALID_OUTPUT: &str = "INVALID_OUTPUT";
    pub(crate) const CONFIRMATION_REQUIRED: &str = "CONFIRMATION_REQUIRED";
    pub(crate) const IDEMPOTENCY_CONFLICT: &str = "IDEMPOTENCY_CONFLICT";
    pub(crate) const EXECUTION_UNCERTAIN: &str = "EXECUTION_UNCERTAIN";
    pub(crate) const IDEMPOTENCY_CAPACITY: &str = "IDEMPOTENCY_CAPACITY";
    pub(crate) const IDEMPOTENCY_UNAVAILABLE: &str = "IDEMPOTENCY_UNAVAILABLE";
    pub(crate) const TIMEOUT: &str = "TIMEOUT";
    pub(crate) const CANCELLED: &str = "CANCELLED";
    pub(crate) const TOOL_PANIC: &str = "TOOL_PANIC";
    pub(crate) const OVERLOADED: &str = "OVERLOADED";
    pub(crate) const UNAUTHENTICATED: &str = "UNAUTHENTICATED";
    pub(crate) const RATE_LIMITED: &str = "RATE_LIMITED";
    pub(crate) const UNSUPPORTED_VERSION: &str = "UNSUPPORTED_VERSION";
    /// A configuration reload refused: the file fails, or there is no file (`409`).
    pub(crate) const CONFIG_INVALID: &str = "CONFIG_INVALID";
    /// A configuration reload refused: the file changes a restart-only key (`409`).
    pub(crate) const RESTART_REQUIRED: &str = "RESTART_REQUIRED";
    /// No execution of the caller has that id (`protocol.md` §9).
    pub(crate) const EXECUTION_NOT_FOUND: &str = "EXECUTION_NOT_FOUND";
    /// A cancellation of an execution that has ended.
    pub(crate) const EXECUTION_ENDED: &str = "EXECUTION_ENDED";
    #[cfg(feature = "redis")]
    pub(crate) const RATE_LIMITER_UNAVAILABLE: &str = "RATE_LIMITER_UNAVAILABLE";
    /// A request that runs something or changes state, sent from a page of another origin.
    pub(crate) const ORIGIN_NOT_ALLOWED: &str = "ORIGIN_NOT_ALLOWED";
    /// An MCP `initialize` over the caller's or the server's cap on open sessions.
    #[cfg(feature = "mcp")]
    pub(crate) const MCP_SESSION_LIMIT: &str = "MCP_SESSION_LIMIT";
    /// A webhook URL the SSRF guard refuses (§8).
    #[cfg(feature = "events")]
    pub(crate) const WEBHOOK_URL_REFUSED: &str = "WEBHOOK_URL_REFUSED";
    /// No event subscription has that id (§8).
    #[cfg(feature = "events")]
    pub(crate) const SUBSCRIPTION_NOT_FOUND: &str = "SUBSCRIPTION_NOT_FOUND";
    /// The subscription is declared in `carmy.toml`, not changed through the API (§8).
    #[cfg(feature = "events")]
    pub(crate) const SUBSCRIPTION_DECLARED: &str = "SUBSCRIPTION_DECLARED";
    /// As many subscriptions as `[events] max_subscriptions` exist already (§8, `409`).
    #[cfg(feature = "events")]
    pub(crate) const SUBSCRIPTION_LIMIT_REACHED: &str = "SUBSCRIPTION_LIMIT_REACHED";
    /// The store of subscriptions and the outbox did not answer (§8).
    #[cfg(feature = "events")]
    pub(crate) const EVENTS_UNAVAILABLE: &str = "EVENTS_UNAVAILABLE";
}

/// carmy/1's paths, shared by the routes and the OpenAPI document that describes them.
pub(crate) mod paths {
    pub(crate) const DISCOVERY: &str = "/.well-known/agent";
    pub(crate) const CATALOG: &str = "/agent/tools";
    /// `POST /agent/tools/{name}`: one tool, its arguments as the body.
    pub(crate) const TOOL: &str = "/agent/tools/{name}";
    pub(crate) const EXECUTE: &str = "/agent/execute";
    pub(crate) const OPENAPI: &str = "/agent/openapi.json";
    /// The caller's executions (`protocol.md` §9); one is `/agent/executions/{id}`.
    pub(crate) const EXECUTIONS: &str = "/agent/executions";
    pub(crate) const HEALTH: &str = "/agent/health";
    pub(crate) const LIVE: &str = "/agent/health/live";
    pub(crate) const READY: &str = "/agent/health/ready";
    /// `POST`: reload `carmy.toml` now (`internal` callers and `manage:config` only).
    pub(crate) const ADMIN_RELOAD: &str = "/agent/admin/reload";
    /// Webhook subscriptions (§8); the OpenAPI generator names it with or without the feature.
    pub(crate) const SUBSCRIPTIONS: &str = "/agent/events/subscriptions";
    /// The console's page, for people (`protocol.md` §10), when it is served.
    pub(crate) const CONSOLE: &str = "/agent/console/";
    /// Prometheus's scrape, when metrics are on.
    pub(crate) const METRICS: &str = "/metrics";
    /// Where MCP is served, when it is.
    pub(crate) const MCP: &str = "/mcp";

    /// The path of the tool called `name`.
    pub(crate) fn tool(name: &str) -> String {
        TOOL.replace("{name}", name)
    }
}

/// The pages of the caller's executions (`protocol.md` §9), shared by the route and the
/// OpenAPI document that describes it.
pub(crate) mod execution_list {
    /// The most executions one page of the list holds.
    pub(crate) const MAX_PAGE: usize = 100;
    /// A page's size when the caller does not say.
    pub(crate) const DEFAULT_PAGE: usize = 20;
}

/// The bounds of event subscriptions (§8), shared by the routes and the OpenAPI document that
/// describes them.
pub(crate) mod subscriptions {
    /// The longest URL a subscription may have, in bytes.
    pub(crate) const MAX_URL_BYTES: usize = 2048;
    /// The longest description a subscription may have, in bytes.
    pub(crate) const MAX_DESCRIPTION_BYTES: usize = 1024;
    /// Subscriptions in a page of the list when the caller does not say.
    pub(crate) const DEFAULT_PAGE: usize = 20;
    /// The most subscriptions in a page of the list.
    pub(crate) const MAX_PAGE: usize = 100;
}

/// carmy/1's own headers.
pub(crate) static CARMY_VERSION: HeaderName = HeaderName::from_static("carmy-version");
pub(crate) static CARMY_REPLAYED: HeaderName = HeaderName::from_static("carmy-replayed");
/// `human` or `agent`: who the caller says it is (`protocol.md` §10).
pub(crate) static CARMY_CHANNEL: HeaderName = HeaderName::from_static("carmy-channel");
pub(crate) static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The headers of MCP's Streamable HTTP transport, which browsers must be allowed to send.
pub(crate) static MCP_SESSION_ID: HeaderName = HeaderName::from_static("mcp-session-id");
pub(crate) static MCP_PROTOCOL_VERSION: HeaderName =
    HeaderName::from_static("mcp-protocol-version");
pub(crate) static MCP_METHOD: HeaderName = HeaderName::from_static("mcp-method");
pub(crate) static MCP_NAME: HeaderName = HeaderName::from_static("mcp-name");
/// RFC 7240 preferences: `Prefer: respond-async` asks for a `202`.
pub(crate) static PREFER: HeaderName = HeaderName::from_static("prefer");
pub(crate) static PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");
pub(crate) static RESPOND_ASYNC: HeaderValue = HeaderValue::from_static("respond-async");
pub(crate) static LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

pub(crate) static JSON: HeaderValue = HeaderValue::from_static("application/json");
pub(crate) static NO_STORE: HeaderValue = HeaderValue::from_static("no-store");
/// The `WWW-Authenticate` challenge of a `401`.
pub(crate) static BEARER_CHALLENGE: HeaderValue =
    HeaderValue::from_static("Bearer realm=\"carmy\"");
