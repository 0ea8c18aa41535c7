//! The documents carmy serves about itself (`protocol.md` §1–3, §11): discovery, the catalog
//! (also in a model provider's shape, `?format=openai|anthropic|gemini`) and the OpenAPI
//! document, one set per trust level, each serialized once per configuration snapshot on its
//! first request (a start-up with a thousand tools would spend most of its time on documents
//! nobody may ask for) with its strong ETag. The catalog's hash is `tools_version`. Serving
//! them (conditional GET, negotiation) is the HTTP layer's.

pub(crate) mod openapi;

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, ETAG};
use bytes::Bytes;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::auth::hex;
use crate::catalog::{self, Catalog, Lossy, Provider, ToolDefinition};
use crate::principal::TrustLevel;
use crate::tool::{Confirmation, Effect, Mode};
use crate::wire::headers::AnswerHeaders;
use crate::wire::{JSON, paths};

const PROTOCOL: &str = "carmy/1";
/// Discovery's capabilities, in this order; `mcp` and `events` only when served.
const CAPABILITIES: &[&str] = &[
    "tools",
    "streaming",
    "idempotency",
    "mcp",
    "health",
    "openapi",
    "executions",
    "events",
    "console",
];

static CACHE_CONTROL_VALUE: HeaderValue = HeaderValue::from_static("private, max-age=60");

/// The discovery documents of every trust level, serialized: each level sees only the tools it
/// may call, with its own ETag and `tools_version`.
#[derive(Debug)]
pub(crate) struct Documents {
    /// Indexed by [`TrustLevel::index`].
    levels: [LevelDocuments; 4],
    /// The console is served: discovery is negotiated.
    console: bool,
}

/// The discovery document, the catalog and the OpenAPI document one trust level sees.
#[derive(Debug)]
pub(super) struct LevelDocuments {
    trust: TrustLevel,
    /// Shared by the levels that see the same tools; built on the first request of any.
    listing: Arc<OnceLock<Listing>>,
    openapi: OnceLock<Document>,
    /// The catalog in each provider's shape, indexed like [`Provider::ALL`].
    providers: [OnceLock<Document>; 3],
    source: Arc<Source>,
}

/// Discovery and the catalog: what a level's visible tools alone decide.
#[derive(Debug)]
struct Listing {
    discovery: Document,
    catalog: Document,
}

/// What the documents built on first request are built from, shared by the levels.
#[derive(Debug)]
struct Source {
    name: String,
    catalog: Arc<Catalog>,
    features: Features,
    /// Every tool in each provider's shape: rewritten once per tool, then picked per level.
    definitions: OnceLock<BTreeMap<&'static str, [ToolDefinition; 3]>>,
}

impl Source {
    fn definitions(&self) -> &BTreeMap<&'static str, [ToolDefinition; 3]> {
        self.definitions.get_or_init(|| {
            self.catalog
                .tools()
                .iter()
                .map(|tool| {
                    let name = tool.descriptor.name;
                    let define = |provider| {
                        catalog::define(provider, name, &tool.description, &tool.input_schema)
                    };
                    (name, Provider::ALL.map(define))
                })
                .collect()
        })
    }
}

/// One serialized document with its validator.
#[derive(Debug)]
pub(super) struct Document {
    body: Bytes,
    /// The quoted hex SHA-256 of `body`.
    etag: HeaderValue,
    /// The headers of its `200`, and of its `304`.
    full: AnswerHeaders,
    not_modified: AnswerHeaders,
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
    openapi_url: &'static str,
    executions_url: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    console_url: Option<&'static str>,
}

#[derive(Serialize)]
struct CatalogBody<'a> {
    tools: Vec<CatalogEntry<'a>>,
}

/// `?format=`: a provider's tool definitions, pasteable as they are, and what each tool's
/// definition could not say.
#[derive(Serialize)]
struct ProviderBody<'a> {
    format: &'static str,
    tools: Vec<&'a Value>,
    #[serde(rename = "x-carmy-lossy")]
    lossy: BTreeMap<&'static str, &'a [Lossy]>,
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

/// What the documents describe besides the catalog.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Features {
    /// MCP is served.
    pub(crate) mcp: bool,
    /// An authenticator checks bearer credentials.
    pub(crate) bearer: bool,
    /// Events are delivered (`[events]`).
    pub(crate) events: bool,
    /// The console is served (`protocol.md` §10).
    pub(crate) console: bool,
}

impl Documents {
    pub(crate) fn build(name: &str, catalog: &Arc<Catalog>, features: Features) -> Self {
        let source = Arc::new(Source {
            name: name.to_owned(),
            catalog: Arc::clone(catalog),
            features,
            definitions: OnceLock::new(),
        });
        // Levels that see the same tools (all of them, when no tool is restricted) share one
        // serialized listing.
        let mut listings: Vec<(Vec<&'static str>, Arc<OnceLock<Listing>>)> = Vec::new();
        let levels = TrustLevel::ALL.map(|trust| {
            let visible: Vec<&'static str> = catalog
                .visible_to(trust)
                .map(|tool| tool.descriptor.name)
                .collect();
            let listing = match listings.iter().find(|(names, _)| *names == visible) {
                Some((_, listing)) => Arc::clone(listing),
                None => {
                    let listing = Arc::default();
                    listings.push((visible, Arc::clone(&listing)));
                    listing
                }
            };
            LevelDocuments {
                trust,
                listing,
                openapi: OnceLock::new(),
                providers: [OnceLock::new(), OnceLock::new(), OnceLock::new()],
                source: Arc::clone(&source),
            }
        });
        Documents {
            levels,
            console: features.console,
        }
    }

    /// The `tools_version` that callers trusted at `trust` see.
    pub(crate) fn tools_version(&self, trust: TrustLevel) -> &str {
        self.levels[trust.index()].listing().catalog.hash()
    }

    /// The documents a caller trusted at `trust` sees.
    pub(crate) fn for_trust(&self, trust: TrustLevel) -> &LevelDocuments {
        &self.levels[trust.index()]
    }

    /// Whether discovery is negotiated: the console is served, and people are sent to it.
    pub(crate) fn negotiated(&self) -> bool {
        self.console
    }
}

impl Listing {
    fn build(source: &Source, trust: TrustLevel) -> Self {
        let Features {
            mcp,
            events,
            console,
            ..
        } = source.features;
        let capabilities: Vec<&str> = CAPABILITIES
            .iter()
            .copied()
            .filter(|capability| match *capability {
                "mcp" => mcp,
                "events" => events,
                "console" => console,
                _ => true,
            })
            .collect();
        let tools = source
            .catalog
            .visible_to(trust)
            .map(|tool| CatalogEntry {
                name: tool.descriptor.name,
                description: &tool.description,
                input_schema: &tool.input_schema,
                output_schema: tool.output_schema(),
                effect: tool.descriptor.effect,
                idempotent: tool.descriptor.idempotent,
                parallel_safe: tool.descriptor.parallel_safe,
                confirmation: tool.descriptor.confirmation,
                mode: tool.descriptor.mode,
                timeout_ms: tool.timeout.map(|timeout| timeout.as_millis()),
            })
            .collect();
        let catalog_document = Document::new(&CatalogBody { tools });
        let discovery = Document::new(&DiscoveryBody {
            protocol: PROTOCOL,
            server: &source.name,
            capabilities: &capabilities,
            tools_url: paths::CATALOG,
            tools_version: catalog_document.hash(),
            execute_url: paths::EXECUTE,
            mcp_url: mcp.then_some(paths::MCP),
            health_url: paths::HEALTH,
            openapi_url: paths::OPENAPI,
            executions_url: paths::EXECUTIONS,
            console_url: console.then_some(paths::CONSOLE),
        });
        Listing {
            discovery,
            catalog: catalog_document,
        }
    }
}

impl LevelDocuments {
    /// Discovery and the catalog this level sees.
    fn listing(&self) -> &Listing {
        self.listing
            .get_or_init(|| Listing::build(&self.source, self.trust))
    }

    /// Discovery as this level sees it.
    pub(crate) fn discovery(&self) -> &Document {
        &self.listing().discovery
    }

    /// The catalog this level sees.
    pub(crate) fn catalog(&self) -> &Document {
        &self.listing().catalog
    }

    /// The OpenAPI document this level sees, built on its first request.
    pub(crate) fn openapi(&self) -> &Document {
        self.openapi.get_or_init(|| {
            let Features {
                mcp,
                bearer,
                events,
                console,
            } = self.source.features;
            Document::new(&openapi::document(
                &self.source.catalog,
                &openapi::Scope {
                    server: &self.source.name,
                    tools_version: self.listing().catalog.hash(),
                    trust: self.trust,
                    bearer,
                    mcp,
                    events,
                    console,
                },
            ))
        })
    }

    /// The catalog in `provider`'s shape, built on its first request.
    pub(crate) fn provider(&self, provider: Provider) -> &Document {
        self.providers[provider.index()].get_or_init(|| {
            let definitions = self.source.definitions();
            let visible: Vec<&ToolDefinition> = self
                .source
                .catalog
                .visible_to(self.trust)
                .map(|tool| &definitions[tool.descriptor.name][provider.index()])
                .collect();
            Document::new(&ProviderBody {
                format: provider.as_str(),
                tools: visible.iter().map(|tool| &tool.definition).collect(),
                lossy: visible
                    .iter()
                    .filter(|definition| !definition.lossy.is_empty())
                    .map(|definition| (definition.name, definition.lossy.as_slice()))
                    .collect(),
            })
        })
    }
}

impl Document {
    fn new(body: &impl Serialize) -> Self {
        let body = serde_json::to_vec(body).expect("documents serialize to JSON");
        let etag = etag_of(&body);
        let etag_header = (ETAG, etag.clone());
        let cache_control = (CACHE_CONTROL, CACHE_CONTROL_VALUE.clone());
        Document {
            full: AnswerHeaders::new(&[
                etag_header.clone(),
                cache_control.clone(),
                (CONTENT_TYPE, JSON.clone()),
                (CONTENT_LENGTH, HeaderValue::from(body.len())),
            ]),
            // The length axum gives an empty body, which hyper does not send with a `304`.
            not_modified: AnswerHeaders::new(&[
                etag_header,
                cache_control,
                (CONTENT_LENGTH, HeaderValue::from_static("0")),
            ]),
            etag,
            body: Bytes::from(body),
        }
    }

    /// The hex hash, without the quotes of the ETag.
    fn hash(&self) -> &str {
        let etag = self.etag.to_str().unwrap_or_default();
        etag.trim_matches('"')
    }

    /// The serialized body.
    pub(crate) fn body(&self) -> &Bytes {
        &self.body
    }

    /// Its validator, the quoted hash.
    pub(crate) fn etag(&self) -> &HeaderValue {
        &self.etag
    }

    /// The headers of its `200`, or of its `304`, under a configuration with or without
    /// security headers.
    pub(crate) fn headers(&self, not_modified: bool, secured: bool) -> axum::http::HeaderMap {
        if not_modified {
            self.not_modified.answer(secured)
        } else {
            self.full.answer(secured)
        }
    }
}

/// A strong ETag: the quoted hex SHA-256 of `body`.
pub(crate) fn etag_of(body: &[u8]) -> HeaderValue {
    let hash = hex(&Sha256::digest(body));
    HeaderValue::try_from(format!("\"{hash}\"")).expect("hex is a valid header")
}
