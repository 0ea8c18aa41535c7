//! `GET /.well-known/agent` and `GET /agent/tools` (`protocol.md` §1–3): serialized once when
//! the router is built, served from memory with a strong ETag and conditional GET.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::Extensions;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, ETAG, IF_NONE_MATCH};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::auth::hex;
use crate::catalog::Catalog;
use crate::principal::{Principal, TrustLevel};
use crate::tool::{Confirmation, Effect, Mode};
use crate::wire::JSON;

pub(crate) const DISCOVERY_PATH: &str = "/.well-known/agent";
pub(crate) const CATALOG_PATH: &str = "/agent/tools";
pub(crate) const EXECUTE_PATH: &str = "/agent/execute";
const PROTOCOL: &str = "carmy/1";
pub(crate) const EXECUTIONS_PATH: &str = "/agent/executions";
const CAPABILITIES: &[&str] = &["tools", "streaming", "idempotency", "health", "executions"];
const CAPABILITIES_WITH_MCP: &[&str] = &[
    "tools",
    "streaming",
    "idempotency",
    "mcp",
    "health",
    "executions",
];
/// Where MCP is served, when it is.
pub(crate) const MCP_PATH: &str = "/mcp";

static CACHE_CONTROL_VALUE: HeaderValue = HeaderValue::from_static("private, max-age=60");

/// The two discovery documents of every trust level, serialized: each level sees only the
/// tools it may call, with its own ETag and `tools_version`.
#[derive(Debug)]
pub(crate) struct Documents {
    /// Indexed by [`TrustLevel::index`].
    levels: [LevelDocuments; 4],
}

/// The discovery document and the catalog one trust level sees.
#[derive(Debug)]
struct LevelDocuments {
    discovery: Document,
    catalog: Document,
}

/// One serialized document with its validator.
#[derive(Debug)]
struct Document {
    body: Bytes,
    /// The quoted hex SHA-256 of `body`.
    etag: HeaderValue,
}

#[derive(Serialize)]
struct DiscoveryBody<'a> {
    protocol: &'static str,
    server: &'a str,
    capabilities: &'a [&'a str],
    tools_url: &'static str,
    tools_version: &'a str,
    execute_url: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    mcp_url: Option<&'static str>,
    health_url: &'static str,
    executions_url: &'static str,
}

#[derive(Serialize)]
struct CatalogBody<'a> {
    tools: Vec<CatalogEntry<'a>>,
}

#[derive(Serialize)]
struct CatalogEntry<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
    output_schema: &'a Value,
    effect: Effect,
    idempotent: bool,
    parallel_safe: bool,
    confirmation: Confirmation,
    mode: Mode,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout_ms: Option<u128>,
}

impl Documents {
    pub(crate) fn build(name: &str, catalog: &Catalog, mcp: bool) -> Self {
        Documents {
            levels: TrustLevel::ALL.map(|trust| LevelDocuments::build(name, catalog, mcp, trust)),
        }
    }

    /// The documents the caller of `request` sees (anonymous when nobody attached a caller).
    fn for_caller(&self, request: &Extensions) -> &LevelDocuments {
        let trust = request
            .get::<Principal>()
            .map_or(TrustLevel::Anonymous, Principal::trust);
        &self.levels[trust.index()]
    }
}

impl LevelDocuments {
    fn build(name: &str, catalog: &Catalog, mcp: bool, trust: TrustLevel) -> Self {
        let tools = catalog
            .visible_to(trust)
            .map(|tool| CatalogEntry {
                name: tool.descriptor.name,
                description: &tool.description,
                input_schema: &tool.input_schema,
                output_schema: &tool.output_schema,
                effect: tool.descriptor.effect,
                idempotent: tool.descriptor.idempotent,
                parallel_safe: tool.descriptor.parallel_safe,
                confirmation: tool.descriptor.confirmation,
                mode: tool.descriptor.mode,
                timeout_ms: tool.descriptor.timeout.map(|timeout| timeout.as_millis()),
            })
            .collect();
        let catalog = Document::new(&CatalogBody { tools });
        let discovery = Document::new(&DiscoveryBody {
            protocol: PROTOCOL,
            server: name,
            capabilities: if mcp {
                CAPABILITIES_WITH_MCP
            } else {
                CAPABILITIES
            },
            tools_url: CATALOG_PATH,
            tools_version: catalog.hash(),
            execute_url: EXECUTE_PATH,
            mcp_url: mcp.then_some(MCP_PATH),
            health_url: super::health::HEALTH_PATH,
            executions_url: EXECUTIONS_PATH,
        });
        LevelDocuments { discovery, catalog }
    }
}

impl Document {
    fn new(body: &impl Serialize) -> Self {
        let body = serde_json::to_vec(body).expect("documents serialize to JSON");
        let hash = hex(&Sha256::digest(&body));
        let etag = HeaderValue::try_from(format!("\"{hash}\"")).expect("hex is a valid header");
        Document {
            body: Bytes::from(body),
            etag,
        }
    }

    /// The hex hash, without the quotes of the ETag.
    fn hash(&self) -> &str {
        let etag = self.etag.to_str().unwrap_or_default();
        etag.trim_matches('"')
    }

    /// `200` with the body, or `304` when the client's `If-None-Match` matches.
    fn respond(&self, request: &HeaderMap) -> Response {
        let headers = [
            (ETAG, self.etag.clone()),
            (CACHE_CONTROL, CACHE_CONTROL_VALUE.clone()),
        ];
        if request
            .get_all(IF_NONE_MATCH)
            .iter()
            .any(|value| if_none_match_matches(value, &self.etag))
        {
            return (StatusCode::NOT_MODIFIED, headers).into_response();
        }
        (headers, [(CONTENT_TYPE, JSON.clone())], self.body.clone()).into_response()
    }
}

pub(crate) async fn discovery(
    State(documents): State<Arc<Documents>>,
    request: Request,
) -> Response {
    documents
        .for_caller(request.extensions())
        .discovery
        .respond(request.headers())
}

pub(crate) async fn catalog(State(documents): State<Arc<Documents>>, request: Request) -> Response {
    documents
        .for_caller(request.extensions())
        .catalog
        .respond(request.headers())
}

/// `If-None-Match` uses weak comparison (RFC 9110 §13.1.2): `W/` prefixes are ignored, `*`
/// matches any current representation, and the value may be a comma-separated list.
fn if_none_match_matches(header: &HeaderValue, etag: &HeaderValue) -> bool {
    let Ok(header) = header.to_str() else {
        return false;
    };
    let etag = etag.as_bytes();
    header.split(',').map(str::trim).any(|candidate| {
        candidate == "*" || candidate.strip_prefix("W/").unwrap_or(candidate).as_bytes() == etag
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_forms() {
        let etag = HeaderValue::from_static("\"abc\"");
        let matches =
            |value: &'static str| if_none_match_matches(&HeaderValue::from_static(value), &etag);
        assert!(matches("\"abc\""));
        assert!(matches("W/\"abc\""));
        assert!(matches("*"));
        assert!(matches("\"x\", \"abc\""));
        assert!(matches("\"x\",W/\"abc\""));
        assert!(!matches("\"abd\""));
        assert!(!matches("abc"));
        assert!(!matches("\"x\", \"y\""));
        assert!(!matches(""));
    }
}
