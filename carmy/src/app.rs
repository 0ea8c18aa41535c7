//! The builder that turns the registered tools into an `axum::Router`, and the serving helper.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::auth::{Authentication, Authenticator};
use crate::catalog::Catalog;
use crate::config::Config;
use crate::context::TrustLevel;
use crate::error::Error;
use crate::health::{Health, Probe};
use crate::http::{self, HttpOptions};
#[cfg(feature = "mcp")]
use crate::mcp::{self, McpHandler, McpOptions};
use crate::protection::{Limiter, Protection, RateLimit, RateLimiter};
use crate::reload::Reloads;
use crate::runtime::{Runtime, RuntimeOptions};
use crate::serve::{self, Server};
use crate::settings::Reloader;
use crate::settings::{Base, Current};
use crate::state::StateMap;
use crate::store::{
    ApprovalStore, ConsentStore, Engine, EventStore, ExecutionStore, KeyStore, StoreChoice,
};
use crate::tool::{self, ToolDescriptor};

/// Starts an app with every tool registered by `#[carmy::tool]` in the program.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let router: axum::Router = carmy::app().name("shop").router()?;
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
/// axum::serve(listener, router).await?;
/// # Ok(()) }
/// ```
pub fn app() -> App {
    App::new().registered_tools()
}

/// Builds the router that serves a set of tools over carmy/1.
///
/// ```no_run
/// use std::time::Duration;
///
/// # async fn run() -> Result<(), carmy::Error> {
/// carmy::app()
///     .name("shop")
///     .default_timeout(Duration::from_secs(10))
///     .load_config()? // carmy.toml, when present, and the CARMY_* variables
///     .serve("127.0.0.1:3000")
///     .await
/// # }
/// ```
#[must_use]
pub struct App {
    name: Option<String>,
    tools: Vec<&'static ToolDescriptor>,
    states: StateMap,
    stores: StoreChoice,
    runtime: RuntimeOptions,
    http: HttpOptions,
    protection: Protection,
    #[cfg(feature = "mcp")]
    mcp: McpOptions,
    server: Server,
    health: Health,
    health_interval: Duration,
    /// `carmy.toml`, applied over the builder's settings.
    config: Option<Config>,
    /// The file `config` came from, reloaded while serving.
    config_source: Option<PathBuf>,
    reloads: Reloads,
    /// The host's own routes, merged beside carmy's.
    routes: Option<axum::Router>,
}

/// A built app: its router, its runtime, its configuration snapshot and the gate its routes
/// sit behind.
pub(crate) struct Built {
    pub(crate) router: axum::Router,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) current: Current,
    pub(crate) gate: http::GateLayer,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("name", &self.name)
            .field("tools", &self.tools.len())
            .field("runtime", &self.runtime)
            .field("authenticator", &self.protection.authentication.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for App {
    fn default() -> Self {
        Self::new()
    }
}

impl App {
    /// An app with no tools: add them with [`App::tool`] or [`App::registered_tools`].
    pub fn new() -> Self {
        App {
            name: None,
            tools: Vec::new(),
            states: StateMap::default(),
            stores: StoreChoice::default(),
            runtime: RuntimeOptions::default(),
            http: HttpOptions::default(),
            protection: Protection::default(),
            #[cfg(feature = "mcp")]
            mcp: McpOptions::default(),
            server: Server::new(),
            health: Health::new(),
            health_interval: Duration::from_secs(10),
            config: None,
            config_source: None,
            reloads: Reloads::default(),
            routes: None,
        }
    }

    /// Adds every tool registered by `#[carmy::tool]` (those without `register = false`).
    pub fn registered_tools(mut self) -> Self {
        self.tools.extend(tool::registered());
        self
    }

    /// Adds one tool, typically one declared with `register = false`: `.tool(my_tool::TOOL)`.
    pub fn tool(mut self, tool: &'static ToolDescriptor) -> Self {
        self.tools.push(tool);
        self
    }

    /// The server's name in the discovery document. Defaults to the executable's name.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Shares a value with the tools that take `State<T>`.
    pub fn state<T: Clone + Send + Sync + 'static>(mut self, value: T) -> Self {
        self.states.insert(value);
        self
    }

    /// The deadline of tools that declare no `timeout` (default 30 s).
    pub fn default_timeout(mut self, timeout: Duration) -> Self {
        self.runtime.default_timeout = timeout;
        self
    }

    /// How many executions may run at once before calls are refused with a retryable
    /// `503 OVERLOADED` (default 1,024).
    pub fn max_in_flight(mut self, executions: usize) -> Self {
        self.runtime.max_in_flight = executions;
        self
    }

    /// How many executions one caller (a principal id; anonymous callers are one caller) may
    /// run at once before its calls are refused with a retryable `503 OVERLOADED`, while other
    /// callers are still served (default: half of [`App::max_in_flight`], at least one).
    /// `max_in_flight` or more lets one caller take every slot.
    pub fn max_in_flight_per_caller(mut self, executions: usize) -> Self {
        self.runtime.max_in_flight_per_caller = Some(executions);
        self
    }

    /// The engine that keeps idempotency records, executions and events (default: a
    /// [`MemoryStore`](crate::store::MemoryStore) of 100,000 records): a shared one
    /// ([`connect`](crate::store::connect)) when several replicas serve the app. It replaces
    /// the stores set before; [`App::key_store`] and its siblings called after it replace
    /// their concern's.
    pub fn store(mut self, engine: impl Engine) -> Self {
        self.stores.engine(engine);
        self
    }

    /// Where idempotency records live, whatever keeps the other concerns: the concerns given
    /// no store (here or by [`App::store`]) share one in-memory engine.
    pub fn key_store(mut self, store: impl KeyStore) -> Self {
        self.stores.keys(store);
        self
    }

    /// Where executions are kept for their callers (`protocol.md` §9), whatever keeps the
    /// other concerns (see [`App::key_store`]).
    pub fn execution_store(mut self, store: impl ExecutionStore) -> Self {
        self.stores.executions(store);
        self
    }

    /// Where event subscriptions and the outbox live (`protocol.md` §8), whatever keeps the
    /// other concerns (see [`App::key_store`]).
    pub fn event_store(mut self, store: impl EventStore) -> Self {
        self.stores.events(store);
        self
    }

    /// Where calls held for a person's approval live (`protocol.md` §12), whatever keeps the
    /// other concerns (see [`App::key_store`]).
    pub fn approval_store(mut self, store: impl ApprovalStore) -> Self {
        self.stores.approvals(store);
        self
    }

    /// Where callers' consents live (`protocol.md` §12), whatever keeps the other concerns
    /// (see [`App::key_store`]).
    pub fn consent_store(mut self, store: impl ConsentStore) -> Self {
        self.stores.consents(store);
        self
    }

    /// How long idempotency records are kept (default 24 h).
    pub fn idempotency_ttl(mut self, ttl: Duration) -> Self {
        self.runtime.record_ttl = ttl;
        self
    }

    /// Decides who is calling from the request head (when host middleware has not inserted a
    /// [`Principal`](crate::Principal)). Without one, callers are anonymous.
    pub fn authenticator(mut self, authenticator: impl Authenticator) -> Self {
        self.protection.authentication = Some(Authentication::Host(Arc::new(authenticator)));
        self
    }

    /// Applies a `carmy.toml` ([`Config`]) over the builder's settings, whatever the order of
    /// the calls: its tokens become the authenticator, its rate limits, CORS origins, header
    /// and `[server]` settings replace the builder's, its `[tools.NAME]` tables override the
    /// tools. A configuration given this way is not reloaded: see [`App::config_file`].
    pub fn config(mut self, config: Config) -> Self {
        self.config = Some(config);
        self.config_source = None;
        self
    }

    /// Reads `carmy.toml` (`CARMY_CONFIG`, else `./carmy.toml` when present) and the
    /// `CARMY_*` overrides, and applies them with [`App::config`]; a file is then reloaded
    /// while serving, as [`App::config_file`] describes.
    pub fn load_config(self) -> Result<Self, Error> {
        match crate::config::default_path() {
            Some(path) => self.config_file(path),
            None => Ok(self.config(Config::load()?)),
        }
    }

    /// Reads the configuration file at `path` and the `CARMY_*` overrides, and applies them
    /// with [`App::config`]. While the app serves, the file is reloaded on SIGHUP, when it
    /// changes (its directory is watched, so renames and Kubernetes ConfigMap updates count),
    /// and on `POST /agent/admin/reload`; see [`App::reloads`].
    pub fn config_file(mut self, path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        self = self.config(Config::load_from(path)?);
        self.config_source = Some(path.to_owned());
        Ok(self)
    }

    /// The app's configuration reloads: their counts by result, and `subscribe` to their
    /// `tools.changed` events.
    pub fn reloads(&self) -> Reloads {
        self.reloads.clone()
    }

    /// Limits each caller trusted at `trust` to `limit`: over it, calls are refused with
    /// `429 RATE_LIMITED` and `Retry-After`. Callers are counted per principal, anonymous ones
    /// per peer address. Unlimited by default.
    pub fn rate_limit(mut self, trust: TrustLevel, limit: RateLimit) -> Self {
        self.protection.limits[trust.index()] = Some(limit);
        self
    }

    /// Where the rate limits are counted (default: in process, a
    /// [`MemoryRateLimiter`](crate::protection::MemoryRateLimiter)); a
    /// `RedisRateLimiter` shares them across replicas.
    pub fn rate_limiter(mut self, limiter: impl RateLimiter) -> Self {
        self.protection.limiter = Limiter::Host(Arc::new(limiter));
        self
    }

    /// Counts anonymous callers by the last address of `X-Forwarded-For` instead of the peer
    /// address. Only behind a proxy that sets it: otherwise callers choose their own key.
    pub fn trust_forwarded_for(mut self, trust: bool) -> Self {
        self.protection.trust_forwarded_for = trust;
        self
    }

    /// Allows browser requests (CORS) from `origin`, e.g. `https://app.example.com`, to carmy/1
    /// and to `/mcp` (whose `Origin` check reads the same list). CORS is off until an origin is
    /// allowed.
    pub fn cors_allowed_origin(mut self, origin: impl Into<String>) -> Self {
        self.protection.cors_origins.push(origin.into());
        self
    }

    /// Adds `X-Content-Type-Options`, `X-Frame-Options`, `Referrer-Policy` and a
    /// `Content-Security-Policy` that allows nothing to every response (default off).
    pub fn security_headers(mut self, enabled: bool) -> Self {
        self.protection.security_headers = enabled;
        self
    }

    /// Serves `GET /metrics` (Prometheus text, OpenMetrics when asked) and counts what it
    /// reports (default off).
    pub fn metrics(mut self, enabled: bool) -> Self {
        self.runtime.metrics = enabled;
        self
    }

    /// The least trusted caller that may read `/metrics` (default anonymous: anyone who
    /// reaches the server). The metrics name every tool, hidden ones too; to other callers
    /// the route does not exist.
    pub fn metrics_trust(mut self, trust: TrustLevel) -> Self {
        self.http.metrics_trust = trust;
        self
    }

    /// How often an SSE stream sends a keep-alive comment while the tool is quiet (default
    /// 15 s).
    pub fn sse_keep_alive(mut self, interval: Duration) -> Self {
        self.http.keep_alive = interval;
        self
    }

    /// How long [`App::serve`] lets executions in flight finish after a shutdown signal
    /// before cancelling them (default 10 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.server = self.server.shutdown_grace(grace);
        self
    }

    /// How long [`App::serve`] gives a client to send a whole request head (default 10 s, at
    /// most 15): see [`Server::head_timeout`].
    pub fn head_timeout(mut self, timeout: Duration) -> Self {
        self.server = self.server.head_timeout(timeout);
        self
    }

    /// After a shutdown signal, how long [`App::serve`] keeps accepting connections with
    /// readiness failing, so load balancers notice before the listener closes (default 5 s,
    /// cut to the grace period).
    pub fn drain_delay(mut self, delay: Duration) -> Self {
        self.server = self.server.drain_delay(delay);
        self
    }

    /// How often the shared idempotency store and rate-limit backend are checked in the
    /// background for `/agent/health` and readiness (default 10 s).
    pub fn health_check_interval(mut self, interval: Duration) -> Self {
        self.health_interval = interval;
        self
    }

    /// The service's health, to report from the host (`report_degrading`, …) and to
    /// `subscribe` to its `health.changed` events. Take it before [`App::router`].
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// How long a client has to send a whole request body once its head arrived: past it the
    /// call is refused with `408 REQUEST_TIMEOUT` (default 30 s, also the most).
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        self.http.body_timeout = timeout;
        self
    }

    /// How long [`App::serve`] keeps a connection with no request in flight (default 60 s, at
    /// most 75): see [`Server::idle_timeout`].
    pub fn idle_timeout(mut self, timeout: Duration) -> Self {
        self.server = self.server.idle_timeout(timeout);
        self
    }

    /// How many connections [`App::serve`] keeps open at once (default: three quarters of the
    /// file-descriptor limit): see [`Server::max_connections`].
    pub fn max_connections(mut self, connections: usize) -> Self {
        self.server = self.server.max_connections(connections);
        self
    }

    /// The same as [`App::cors_allowed_origin`]: one list of origins serves carmy/1's CORS
    /// and MCP's `Origin` check (loopback origins are always allowed to MCP). Any other
    /// `Origin` is refused with `403`.
    #[cfg(feature = "mcp")]
    pub fn mcp_allowed_origin(self, origin: impl Into<String>) -> Self {
        self.cors_allowed_origin(origin)
    }

    /// The caller of MCP requests over stdio, where no request head exists to authenticate
    /// (default: anonymous). The desktop host that starts the process decides.
    #[cfg(feature = "mcp")]
    pub fn mcp_stdio_principal(mut self, principal: crate::Principal) -> Self {
        self.mcp.stdio_principal = principal;
        self
    }

    /// How many MCP sessions (the `initialize`/`Mcp-Session-Id` generation) one caller may have
    /// open at once (default 32): a caller is a token's id, and an anonymous caller the address
    /// it connects from (one for all of them when served without connection info). An
    /// `initialize` over the cap is refused with `503 MCP_SESSION_LIMIT`.
    #[cfg(feature = "mcp")]
    pub fn mcp_sessions_per_caller(mut self, sessions: usize) -> Self {
        self.mcp.sessions.per_caller = sessions;
        self
    }

    /// How many MCP sessions the server keeps open at once, all callers together (default
    /// 4,096); over it, `initialize` is refused with `503 MCP_SESSION_LIMIT`.
    #[cfg(feature = "mcp")]
    pub fn mcp_max_sessions(mut self, sessions: usize) -> Self {
        self.mcp.sessions.total = sessions;
        self
    }

    /// How long an MCP session may go without a request before it ends (default 5 minutes),
    /// freeing its place.
    #[cfg(feature = "mcp")]
    pub fn mcp_session_idle_timeout(mut self, idle: std::time::Duration) -> Self {
        self.mcp.sessions.idle = idle;
        self
    }

    /// Serves the host's own `routes` beside carmy's, outside carmy's checks (no rate limit, no
    /// caller, no security headers): what [`App::serve`] cannot otherwise add. The example
    /// serves the console at `/` this way. A route carmy serves too panics, as
    /// [`axum::Router::merge`] does.
    pub fn merge(mut self, routes: axum::Router) -> Self {
        self.routes = Some(match self.routes.take() {
            Some(earlier) => earlier.merge(routes),
            None => routes,
        });
        self
    }

    /// Checks the app and builds the router. Every mistake (duplicate tool names, missing
    /// state, an input schema that is not an object) is found here, never at request time.
    /// An input schema that does not compile into a validator is found here in a debug build;
    /// a release build compiles each validator on its tool's first call, so that a large
    /// catalog starts at once, and such a tool's calls fail with `INTERNAL` (logged).
    pub fn router(self) -> Result<axum::Router, Error> {
        self.build().map(|built| built.router)
    }

    /// Serves the app on `addr` until SIGINT or SIGTERM, then shuts down gracefully: stops
    /// accepting connections, lets executions in flight finish within the grace period, then
    /// cancels the rest and closes every connection. Connections are limited as [`Server`]
    /// describes.
    pub async fn serve(self, addr: impl tokio::net::ToSocketAddrs) -> Result<(), Error> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        self.serve_with_shutdown(listener, serve::shutdown_signal())
            .await
    }

    /// Like [`App::serve`], on a bound listener, until `shutdown` resolves.
    pub async fn serve_with_shutdown(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let server = self.configured_server();
        server.check()?;
        let Built {
            router,
            runtime,
            current: _,
            gate,
        } = self.build()?;
        tracing::info!(addr = %listener.local_addr()?, "serving carmy/1");
        // The whole server is carmy's: every unknown path gets the JSON 404, behind the gate
        // like every carmy answer, and every other method on a path the host added the JSON 405.
        let router = router
            .fallback_service(gate.endpoints(()).handler(http::route_not_found))
            .method_not_allowed_fallback(http::method_not_allowed);
        server.run(listener, router, shutdown, Some(runtime)).await;
        Ok(())
    }

    /// Serves MCP on stdin and stdout, for desktop hosts that start the program, until the
    /// host closes stdin; then lets executions in flight finish. Log to stderr only.
    #[cfg(feature = "mcp")]
    pub async fn serve_stdio(mut self) -> Result<(), Error> {
        let principal = std::mem::take(&mut self.mcp.stdio_principal);
        let started = self.start()?;
        started.reloader.watch();
        let runtime = started.runtime;
        tracing::info!("serving MCP on stdio");
        mcp::serve_stdio(McpHandler::new(
            &started.name,
            Arc::clone(&runtime),
            started.current,
            principal,
        ))
        .await?;
        runtime.wait_idle().await;
        Ok(())
    }

    /// The builder's `[server]` settings with the configuration's over them.
    fn configured_server(&self) -> Server {
        match &self.config {
            Some(config) => self.server.clone().configure(&config.server),
            None => self.server.clone(),
        }
    }

    pub(crate) fn build(mut self) -> Result<Built, Error> {
        if let Some(timeout) = self
            .config
            .as_ref()
            .and_then(|config| config.server.body_timeout)
        {
            self.http.body_timeout = timeout;
        }
        if let Some(config) = &self.config {
            // `[metrics] trust` is the snapshot's (`Base::build`): it reloads.
            if let Some(enabled) = config.metrics.enabled {
                self.runtime.metrics = enabled;
            }
        }
        crate::config::check_body_timeout(self.http.body_timeout)?;
        let http = self.http.clone();
        let routes = self.routes.take();
        #[cfg(feature = "mcp")]
        let mcp = self.mcp.clone();
        let started = self.start()?;
        started.reloader.watch();
        let current = &started.current;
        let gate = http::GateLayer::new(
            current,
            started.runtime.metrics().cloned(),
            http.body_timeout,
        );
        let router = crate::api::router(
            &gate,
            Arc::clone(&started.runtime),
            started.reloader,
            current,
            &http,
            #[cfg(feature = "events")]
            Arc::clone(&started.events),
        );
        #[cfg(feature = "mcp")]
        let router = router.merge(mcp::router(
            &gate,
            McpHandler::new(
                &started.name,
                Arc::clone(&started.runtime),
                Arc::clone(current),
                mcp.stdio_principal.clone(),
            ),
            http.keep_alive,
            mcp.sessions,
            started.runtime.shutdown_token(),
        ));
        let router = match routes {
            Some(routes) => router.merge(routes),
            None => router,
        };
        // A path no route has gets axum's empty `404` behind the gate too. Merged last: of two
        // default fallbacks, a merge keeps the merged router's, and a host's own fallback still
        // wins over it.
        let router = router.merge(axum::Router::new().layer(gate.clone()));
        Ok(Built {
            router,
            runtime: started.runtime,
            current: started.current,
            gate,
        })
    }

    /// Checks the app, starts its runtime and builds its first configuration snapshot.
    fn start(self) -> Result<Started, Error> {
        let name = match self.name {
            Some(name) if name.trim().is_empty() => return Err(Error::EmptyName),
            Some(name) => name,
            None => default_name(),
        };
        let catalog = Catalog::build(self.tools, &self.states)?;
        log_tools(&catalog);
        let stores = self.stores.build();
        #[cfg_attr(not(feature = "events"), expect(unused_mut))]
        let mut runtime = Runtime::new(
            &catalog,
            self.states,
            stores.clone(),
            self.runtime.clone(),
            self.health.clone(),
            &self.reloads,
        );
        let limiter = self.protection.limiter.host().cloned();
        let mut protection = self.protection;
        protection.metrics = runtime.metrics().cloned();
        let base = Base {
            name: name.clone(),
            mcp: cfg!(feature = "mcp"),
            catalog,
            protection,
            runtime: self.runtime,
            metrics_trust: self.http.metrics_trust,
        };
        let current: Current = Arc::new(ArcSwap::from_pointee(base.build(self.config.as_ref())?));
        #[cfg(feature = "events")]
        let events = {
            let in_force = {
                let current = Arc::clone(&current);
                Box::new(move || current.load().events.clone())
            };
            let events = crate::events::Events::new(
                Arc::clone(&stores.events),
                in_force,
                self.health.clone(),
            );
            runtime.publish_to(Arc::clone(&events));
            // A router built outside a runtime (a test, a CLI) publishes nothing in the
            // background; the app serves inside one.
            if let Ok(background) = tokio::runtime::Handle::try_current() {
                let stop = runtime.shutdown_token();
                background.spawn(crate::events::deliver_outbox(Arc::downgrade(&events), stop));
                background.spawn(crate::events::forward_changes(
                    Arc::downgrade(&events),
                    self.health.subscribe(),
                    self.reloads.subscribe(),
                ));
            } else if current.load().events.is_some() {
                tracing::warn!(
                    "events not delivered: the router was built outside a Tokio runtime"
                );
            }
            events
        };
        self.health
            .watch(probes(&stores, limiter, &current), self.health_interval);
        let reloader = Reloader::new(
            self.config_source,
            self.config,
            base,
            Arc::clone(&current),
            self.health,
            self.reloads,
        );
        Ok(Started {
            #[cfg(feature = "mcp")]
            name,
            #[cfg(feature = "events")]
            events,
            runtime: Arc::new(runtime),
            current,
            reloader,
        })
    }
}

/// A checked app with its runtime running.
struct Started {
    /// The server's name, which MCP announces.
    #[cfg(feature = "mcp")]
    name: String,
    runtime: Arc<Runtime>,
    current: Current,
    reloader: Arc<Reloader>,
    #[cfg(feature = "events")]
    events: Arc<crate::events::Events>,
}

/// The executable's file name, the natural name of a one-binary service.
fn default_name() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|path| path.file_stem()?.to_str().map(str::to_owned))
        .unwrap_or_else(|| "carmy".to_owned())
}

/// One line at start-up, so that a crate whose tools were never linked is visible.
fn log_tools(catalog: &Catalog) {
    let tools = catalog.tools().len();
    if tools == 0 {
        tracing::warn!(
            tools,
            "serving 0 tools: no `#[carmy::tool]` was linked or added"
        );
    } else {
        let noun = if tools == 1 { "tool" } else { "tools" };
        tracing::info!(tools, "serving {tools} {noun}");
    }
    for tool in catalog.tools() {
        tracing::debug!(tool = tool.descriptor.name(), "serving tool");
    }
}

/// The health checks of what the app depends on outside the process: the key store when it
/// answers pings (a shared one), and the host's rate limiter while a limit is set.
fn probes(
    stores: &crate::store::Stores,
    limiter: Option<Arc<dyn RateLimiter>>,
    current: &Current,
) -> Vec<Probe> {
    use futures_util::FutureExt;
    let mut probes = Vec::new();
    let keys = Arc::clone(&stores.keys);
    if keys.ping().is_some() {
        probes.push(Probe {
            name: "idempotency",
            ping: Box::new(move || {
                let keys = Arc::clone(&keys);
                async move {
                    match keys.ping() {
                        Some(ping) => ping.await.map_err(|error| error.to_string()),
                        None => Ok(()),
                    }
                }
                .boxed()
            }),
            in_use: Box::new(|| true),
        });
    }
    if let Some(limiter) = limiter.filter(|limiter| limiter.ping().is_some()) {
        let current = Arc::clone(current);
        probes.push(Probe {
            name: "rate_limit",
            ping: Box::new(move || {
                let limiter = Arc::clone(&limiter);
                async move {
                    match limiter.ping() {
                        Some(ping) => ping.await.map_err(|error| error.to_string()),
                        None => Ok(()),
                    }
                }
                .boxed()
            }),
            in_use: Box::new(move || current.load().protection.limits.iter().any(Option::is_some)),
        });
    }
    probes
}
