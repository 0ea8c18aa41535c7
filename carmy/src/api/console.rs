//! The console (`protocol.md` §10): a page for people, embedded in the binary from
//! `carmy/console/`, that drives the same public API an agent does with the caller's own
//! token. It has no privileges of its own and embeds no tool: it reads the catalog the caller
//! may see.

use std::sync::LazyLock;

use axum::Router;
use axum::http::header::{
    CONTENT_SECURITY_POLICY, LOCATION, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use tower::Layer;

use super::document_routes::conditional;
use crate::documents::etag_of;
use crate::http::GateLayer;
use crate::wire::paths::CONSOLE as CONSOLE_URL;

/// Scripts, styles, images and requests from the console's own origin only: no inline script,
/// no `style=""`, no `data:` image, no framing, no form posted anywhere.
static POLICY: HeaderValue = HeaderValue::from_static(
    "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
);
/// Revalidated on every load (a cheap `304`), so an upgraded server is never shown stale files.
static REVALIDATE: HeaderValue = HeaderValue::from_static("no-cache");
static NOSNIFF: HeaderValue = HeaderValue::from_static("nosniff");
static NO_REFERRER: HeaderValue = HeaderValue::from_static("no-referrer");

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: HeaderValue,
    body: &'static str,
    etag: HeaderValue,
}

impl Asset {
    fn new(name: &'static str, content_type: &'static str, body: &'static str) -> Self {
        Asset {
            name,
            content_type: HeaderValue::from_static(content_type),
            body,
            etag: weak(&etag_of(body.as_bytes())),
        }
    }

    fn respond(&self, request: &HeaderMap) -> Response {
        let mut response = conditional(
            request,
            &self.etag,
            &REVALIDATE,
            &self.content_type,
            Bytes::from_static(self.body.as_bytes()),
        );
        let headers = response.headers_mut();
        headers.insert(CONTENT_SECURITY_POLICY, POLICY.clone());
        headers.insert(X_CONTENT_TYPE_OPTIONS, NOSNIFF.clone());
        headers.insert(REFERRER_POLICY, NO_REFERRER.clone());
        response
    }
}

/// Weak: the same validator stands for the gzip and the identity bytes of a file.
fn weak(etag: &HeaderValue) -> HeaderValue {
    let mut weak = b"W/".to_vec();
    weak.extend_from_slice(etag.as_bytes());
    HeaderValue::from_bytes(&weak).expect("a quoted hex hash with W/ is a valid header")
}

const PAGE: &str = "index.html";

static ASSETS: LazyLock<[Asset; 4]> = LazyLock::new(|| {
    [
        Asset::new(
            PAGE,
            "text/html; charset=utf-8",
            include_str!("../../console/index.html"),
        ),
        Asset::new(
            "console.js",
            "text/javascript; charset=utf-8",
            include_str!("../../console/console.js"),
        ),
        Asset::new(
            "console.css",
            "text/css; charset=utf-8",
            include_str!("../../console/console.css"),
        ),
        Asset::new(
            "icon.svg",
            "image/svg+xml",
            include_str!("../../console/icon.svg"),
        ),
    ]
});

/// The console's routes, gzip-compressed for clients that accept it.
pub(super) fn router(gate: &GateLayer) -> Router {
    let base = CONSOLE_URL.trim_end_matches('/');
    let files = format!("{CONSOLE_URL}{{file}}");
    // Compressed inside the gate: the console's own router, behind it at each of its paths.
    let console = gate.layer(
        Router::new()
            .route(base, get(to_console))
            .route(CONSOLE_URL, get(page))
            .route(&format!("{CONSOLE_URL}{SESSION}"), get(session))
            .route(&files, get(file))
            .method_not_allowed_fallback(crate::http::method_not_allowed)
            .layer(tower_http::compression::CompressionLayer::new()),
    );
    [base, CONSOLE_URL, &files]
        .into_iter()
        .fold(Router::new(), |router, path| {
            router.route_service(path, console.clone())
        })
}

/// The console's page, for a host that also serves it at an address of its own (the example
/// mounts it at `/`): `router.route("/", axum::routing::get(carmy::console::page))`. The page
/// loads its files from `/agent/console/`.
pub async fn page(headers: HeaderMap) -> Response {
    ASSETS[0].respond(&headers)
}

async fn file(uri: Uri, headers: HeaderMap) -> Response {
    let name = uri.path().rsplit('/').next().unwrap_or_default();
    match ASSETS
        .iter()
        .find(|asset| asset.name == name && name != PAGE)
    {
        Some(asset) => asset.respond(&headers),
        None => crate::http::not_a_route().into_response(),
    }
}

/// The console's own route: who the page calls as, and which management views that caller may
/// open, so the page never requests a route that would answer it `404`. It tells the caller
/// about itself and grants nothing.
const SESSION: &str = "session";

async fn session(request: axum::extract::Request) -> Response {
    let caller = crate::http::Admitted::caller_or_anonymous(request.extensions());
    let identified = caller.trust() != crate::principal::TrustLevel::Anonymous;
    #[cfg(feature = "events")]
    let manage_events = request
        .extensions()
        .get::<crate::http::Admitted>()
        .is_some_and(|admitted| admitted.settings.events.is_some())
        && super::may_manage(&request, super::event_routes::MANAGE_EVENTS);
    #[cfg(not(feature = "events"))]
    let manage_events = false;
    let body = serde_json::json!({
        "caller": {
            "id": identified.then(|| caller.id()),
            "trust": caller.trust().as_str(),
        },
        "manage_events": manage_events,
    });
    let mut response = axum::Json(body).into_response();
    response.headers_mut().insert(
        axum::http::header::CACHE_CONTROL,
        crate::wire::NO_STORE.clone(),
    );
    response
}

/// `/agent/console` without its slash: where the page's relative addresses would resolve
/// wrongly.
async fn to_console() -> Response {
    (
        StatusCode::PERMANENT_REDIRECT,
        [(LOCATION, HeaderValue::from_static(CONSOLE_URL))],
    )
        .into_response()
}
