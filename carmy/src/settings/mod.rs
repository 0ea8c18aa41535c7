//! The configuration snapshot: every object a request reads that `carmy.toml` may change (the
//! admission settings, the catalog with its per-tool overrides, the serialized documents and
//! MCP's tool lists, the last two built on first use),
//! derived from one [`Config`] in one step that either succeeds whole or changes nothing.
//!
//! The protection gate loads the snapshot once per request and attaches it to the request, so
//! the routes behind it serve that same snapshot even when a reload swaps in another meanwhile.

mod reload;
mod watch;

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::auth::Authentication;
use crate::catalog::Catalog;
use crate::config::Config;
use crate::documents::{Documents, Features};
use crate::error::Error;
use crate::principal::TrustLevel;
use crate::protection::Protection;
use crate::runtime;

pub(crate) use reload::{ReloadError, Reloaded, Reloader, Trigger};

/// The snapshot in force; a reload swaps it atomically.
pub(crate) type Current = Arc<ArcSwap<Settings>>;

/// One configuration, with everything derived from it.
pub(crate) struct Settings {
    pub(crate) protection: Protection,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) documents: Documents,
    /// MCP's tool list of each trust level, indexed by [`TrustLevel::index`]: built on the
    /// level's first `tools/list`, since a start-up pays for nothing an agent may never ask.
    #[cfg(feature = "mcp")]
    mcp_tools: [std::sync::OnceLock<Vec<rmcp::model::Tool>>; 4],
    /// `[events]`; `None` while events are off.
    #[cfg(feature = "events")]
    pub(crate) events: Option<Arc<crate::events::EventPolicy>>,
    /// The least trusted caller that may read `/metrics` (when metrics are on).
    pub(crate) metrics_trust: TrustLevel,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("tools", &self.catalog.tools().len())
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// MCP's tool list for callers trusted at `trust`.
    #[cfg(feature = "mcp")]
    pub(crate) fn mcp_tools(&self, trust: TrustLevel) -> &[rmcp::model::Tool] {
        self.mcp_tools[trust.index()]
            .get_or_init(|| crate::catalog::mcp::list(&self.catalog, trust))
    }

    /// `tools_version` of each trust level's catalog, indexed by [`TrustLevel::index`].
    pub(crate) fn tools_versions(&self) -> [&str; 4] {
        TrustLevel::ALL.map(|trust| self.documents.tools_version(trust))
    }
}

/// What the builder set, onto which every configuration file applies.
pub(crate) struct Base {
    pub(crate) name: String,
    /// Whether MCP is served, which discovery announces.
    pub(crate) mcp: bool,
    /// Every tool as declared.
    pub(crate) catalog: Catalog,
    pub(crate) protection: Protection,
    pub(crate) runtime: runtime::RuntimeOptions,
    /// The builder's `App::metrics_trust`, which `[metrics] trust` replaces.
    pub(crate) metrics_trust: TrustLevel,
}

impl Base {
    /// The settings of `config` over the builder's: its tokens replace the builder's
    /// authenticator (none keeps it), its limits, CORS origins and header settings replace the
    /// builder's, its `[tools.NAME]` tables override the tools.
    ///
    /// Its errors quote the file (a tool's name, a URL): they are clipped as the file's own are.
    pub(crate) fn build(&self, config: Option<&Config>) -> Result<Settings, Error> {
        self.derive(config).map_err(crate::config::clipped)
    }

    fn derive(&self, config: Option<&Config>) -> Result<Settings, Error> {
        let mut protection = self.protection.clone();
        let catalog = match config {
            None => Catalog::clone(&self.catalog),
            Some(config) => {
                let Config {
                    authenticator,
                    limits,
                    trust_forwarded_for,
                    cors_origins,
                    security_headers,
                    // Applied once, to the server: a change needs a restart.
                    server: _,
                    // `enabled` is applied once, to the routes; `trust` below.
                    metrics: _,
                    tools,
                    // Below, with the other derived objects.
                    events: _,
                } = config;
                if let Some(tokens) = authenticator {
                    protection.authentication =
                        Some(Authentication::Tokens(Arc::new(tokens.clone())));
                }
                protection.limits = *limits;
                protection.trust_forwarded_for = *trust_forwarded_for;
                protection.cors_origins.clone_from(cors_origins);
                protection.security_headers = *security_headers;
                self.catalog.with_overrides(tools)?
            }
        };
        runtime::check_record_ttl(&catalog, &self.runtime)?;
        let events_config = config.and_then(|config| config.events.as_ref());
        #[cfg(feature = "events")]
        let events = events_config
            .map(crate::events::EventPolicy::build)
            .transpose()?
            .map(Arc::new);
        #[cfg(not(feature = "events"))]
        if events_config.is_some() {
            return Err(Error::Config(
                "[events] needs carmy's `events` cargo feature, which this build does not enable"
                    .to_owned(),
            ));
        }
        let features = Features {
            mcp: self.mcp,
            bearer: protection.authentication.is_some(),
            events: events_config.is_some(),
            console: cfg!(feature = "console"),
        };
        let catalog = Arc::new(catalog);
        let documents = Documents::build(&self.name, &catalog, features);
        let metrics_trust = config
            .and_then(|config| config.metrics.trust)
            .unwrap_or(self.metrics_trust);
        Ok(Settings {
            metrics_trust,
            protection,
            #[cfg(feature = "mcp")]
            mcp_tools: Default::default(),
            catalog,
            documents,
            #[cfg(feature = "events")]
            events,
        })
    }
}
