//! The one service every carmy route sits behind: CORS, the request body's deadline, the
//! server span and the HTTP metrics, and inside them the protection gate. One hand-written
//! service rather than a stack of layers and `from_fn` middleware, each of which cloned what it
//! wraps and boxed its future on every request. It wraps each handler where its route is made
//! ([`GateLayer::endpoints`]): `Router::layer` would box every route a second time, around the
//! gate.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request};
use axum::handler::{Handler, HandlerService};
use axum::http::{HeaderName, Method};
use axum::response::Response;
use axum::routing::{MethodFilter, MethodRouter};
use bytes::Bytes;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use http_body::{Body as _, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::{Layer, Service, ServiceExt, service_fn};
use tower_http::cors::CorsLayer;
use tracing::Instrument;

use super::admission::{self, Admission};
use super::{Header, Present};
use crate::settings::Current;
use crate::telemetry::{self, Metrics, TraceParent};

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// Builds the [`Gate`] of each route.
#[derive(Clone)]
pub(crate) struct GateLayer {
    shared: Arc<Shared>,
}

struct Shared {
    current: Current,
    /// How the routes behind this gate are admitted, and their refusals rendered.
    admission: Admission,
    /// `None` while metrics are off.
    metrics: Option<Arc<Metrics>>,
    /// How long a request body may take to arrive, from the end of its head.
    body_timeout: Duration,
    cors: CorsLayer,
}

impl GateLayer {
    pub(crate) fn new(
        current: &Current,
        metrics: Option<Arc<Metrics>>,
        body_timeout: Duration,
    ) -> Self {
        GateLayer {
            shared: Arc::new(Shared {
                current: Arc::clone(current),
                admission: Admission::CARMY,
                metrics,
                body_timeout,
                cors: admission::cors_layer(Arc::clone(current)),
            }),
        }
    }

    /// The same gate for another transport's routes, admitted as `admission` says.
    #[cfg(feature = "mcp")]
    pub(crate) fn for_transport(&self, admission: Admission) -> Self {
        let Shared {
            current,
            admission: _,
            metrics,
            body_timeout,
            cors,
        } = &*self.shared;
        GateLayer {
            shared: Arc::new(Shared {
                current: Arc::clone(current),
                admission,
                metrics: metrics.clone(),
                body_timeout: *body_timeout,
                cors: cors.clone(),
            }),
        }
    }

    /// The handlers of one router's routes, on `state`, each behind the gate.
    pub(crate) fn endpoints<S>(&self, state: S) -> Endpoints<S> {
        Endpoints {
            gate: self.clone(),
            state,
        }
    }
}

/// Builds routes whose handlers share one state, each behind the gate. A path made by
/// [`Endpoints::get`], [`Endpoints::post`] or [`Endpoints::inline`] answers its other methods
/// with carmy's JSON `405` (behind the gate too) unless given a fallback of its own.
pub(crate) struct Endpoints<S> {
    gate: GateLayer,
    state: S,
}

impl<S: Clone + Send + Sync + 'static> Endpoints<S> {
    /// `handler` behind the gate: the service of one method of a route.
    pub(crate) fn handler<H, T>(&self, handler: H) -> Gate<HandlerService<H, T, S>>
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.gate.layer(handler.with_state(self.state.clone()))
    }

    /// A route answering `GET` with `handler`.
    pub(crate) fn get<H, T>(&self, handler: H) -> MethodRouter
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.methods().get_service(self.handler(handler))
    }

    /// A route answering `POST` with `handler`.
    pub(crate) fn post<H, T>(&self, handler: H) -> MethodRouter
    where
        H: Handler<T, S>,
        T: 'static,
    {
        self.methods().post_service(self.handler(handler))
    }

    /// A route answering `GET` with `function` inside the gate ([`Endpoints::inline`]).
    pub(crate) fn get_inline<F, Answered>(&self, function: F) -> MethodRouter
    where
        F: Fn(S, Request) -> Answered + Clone + Send + Sync + 'static,
        Answered: Future<Output = Response> + Send + 'static,
    {
        self.inline(MethodFilter::GET, function)
    }

    /// A route answering `POST` with `function` inside the gate ([`Endpoints::inline`]).
    pub(crate) fn post_inline<F, Answered>(&self, function: F) -> MethodRouter
    where
        F: Fn(S, Request) -> Answered + Clone + Send + Sync + 'static,
        Answered: Future<Output = Response> + Send + 'static,
    {
        self.inline(MethodFilter::POST, function)
    }

    /// A route answering `method` with `function`, a handler that takes its state and the whole
    /// request, with no extractors. It runs inside the gate's future, where an axum handler's
    /// future is boxed on its own on every request, with the request taken apart and put
    /// together again for the extractors. The gate's future is moved whole when it is boxed,
    /// so `function`'s future should be small (several hundred bytes, not kilobytes).
    fn inline<F, Answered>(&self, method: MethodFilter, function: F) -> MethodRouter
    where
        F: Fn(S, Request) -> Answered + Clone + Send + Sync + 'static,
        Answered: Future<Output = Response> + Send + 'static,
    {
        let state = self.state.clone();
        let inline = service_fn(move |request| function(state.clone(), request).never_error());
        self.methods().on_service(method, self.gate.layer(inline))
    }

    /// A route answering every method with `handler`.
    pub(crate) fn any<H, T>(&self, handler: H) -> MethodRouter
    where
        H: Handler<T, S>,
        T: 'static,
    {
        axum::routing::any_service(self.handler(handler))
    }

    fn methods(&self) -> MethodRouter {
        let not_allowed = self.gate.layer(super::method_not_allowed.with_state(()));
        MethodRouter::new().fallback_service(not_allowed)
    }
}

impl<S> Layer<S> for GateLayer {
    type Service = Gate<S>;

    fn layer(&self, inner: S) -> Gate<S> {
        Gate {
            shared: Arc::clone(&self.shared),
            inner,
            cors_applied: false,
        }
    }
}

/// A route behind the gate.
#[derive(Clone)]
pub(crate) struct Gate<S> {
    shared: Arc<Shared>,
    inner: S,
    /// Set on the copy that tower-http's CORS service wraps, so it is applied once.
    cors_applied: bool,
}

impl<S> Service<Request> for Gate<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        // CORS only for a request that carries an `Origin` while origins are configured: any
        // other request skips it (and its `Vary` headers), and a preflight while CORS is off is
        // carmy's JSON `405` like any other unrouted method.
        let present = Present::of(request.headers());
        let cross_origin = !self.cors_applied
            && present.has(Header::Origin)
            && !self
                .shared
                .current
                .load()
                .protection
                .cors_origins
                .is_empty();
        if cross_origin {
            let mut gate = self.clone();
            gate.cors_applied = true;
            return Box::pin(self.shared.cors.layer(gate).oneshot(request));
        }
        // The service that was polled ready answers; a clone stays for the next request.
        let ready = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, ready);
        Box::pin(Arc::clone(&self.shared).pass(inner, request, present))
    }
}

impl Shared {
    /// The server span of every request, child of the caller's `traceparent`; with metrics on,
    /// `http_server_active_requests` and `http_server_request_duration_seconds` (to the
    /// response head: a stream's length is the tool's, not the server's). The route is the
    /// matched template, never the raw path, so no request adds a series. Refusals by the
    /// protection gate are measured and traced too.
    ///
    /// What needs no waiting is done here, and the rest is combinators around the gate's
    /// future rather than an async block, which would keep the request's parts beside the
    /// future they were moved into: the boxed future of every request stays small enough for
    /// the allocator's per-thread cache.
    fn pass<S>(
        self: Arc<Self>,
        inner: S,
        request: Request,
        present: Present,
    ) -> impl Future<Output = Result<Response, Infallible>>
    where
        S: Service<Request, Response = Response, Error = Infallible>,
    {
        let (parts, body) = request.into_parts();
        let started = Instant::now();
        // A request without a body (most `GET`s) has nothing to wait for.
        let body = if body.is_end_stream() {
            body
        } else {
            Body::new(DeadlineBody::new(body, started + self.body_timeout))
        };
        let method = method_label(&parts.method);
        let matched = parts.extensions.get::<MatchedPath>().cloned();
        // Several `traceparent`s are malformed, as the specification says: a new trace.
        let parent = present
            .has(Header::Traceparent)
            .then(|| {
                let mut traceparents = parts.headers.get_all(&TRACEPARENT).iter();
                match (traceparents.next(), traceparents.next()) {
                    (Some(value), None) => value.to_str().ok().and_then(TraceParent::parse),
                    _ => None,
                }
            })
            .flatten();
        let route = matched.as_ref().map(MatchedPath::as_str);
        let span = telemetry::server_span(method, route, parent.as_ref());
        // `inner` is the copy the gate's `poll_ready` polled: it is called as it is, without
        // a `Oneshot` polling it again and moving the request through its states.
        let routed = move |request| {
            let mut inner = inner;
            inner
                .call(request)
                .map(|answered| answered.unwrap_or_else(|never| match never {}))
        };
        let guarded = admission::guard(
            &self.current,
            self.admission,
            parts,
            body,
            present,
            started,
            routed,
        );
        let answering = Answering::begin(self);
        guarded.instrument(span.clone()).map(move |response| {
            let status = response.status().as_u16();
            span.record("http.response.status_code", status);
            if let Some(metrics) = &answering.0.metrics {
                metrics.http_answered(method, matched, status, started.elapsed());
            }
            drop(answering);
            Ok(response)
        })
    }
}

/// A request, counted in `http_server_active_requests` (when metrics are on) until it is
/// dropped: answered, or given up when its client went away.
struct Answering(Arc<Shared>);

impl Answering {
    fn begin(shared: Arc<Shared>) -> Self {
        if let Some(metrics) = &shared.metrics {
            metrics.http_request_began();
        }
        Answering(shared)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        if let Some(metrics) = &self.0.metrics {
            metrics.http_request_ended();
        }
    }
}

/// The semantic conventions' `http.request.method`: the known methods, `_OTHER` for the rest.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [(Method, &str); 9] = [
        (Method::GET, "GET"),
        (Method::HEAD, "HEAD"),
        (Method::POST, "POST"),
        (Method::PUT, "PUT"),
        (Method::DELETE, "DELETE"),
        (Method::CONNECT, "CONNECT"),
        (Method::OPTIONS, "OPTIONS"),
        (Method::TRACE, "TRACE"),
        (Method::PATCH, "PATCH"),
    ];
    KNOWN
        .iter()
        .find(|(known, _)| known == method)
        .map_or("_OTHER", |(_, name)| name)
}

/// A request body that must have arrived by a deadline. Unlike tower-http's `DeadlineBody`, it
/// reads the body first and starts its timer only when the body makes it wait: the usual small
/// body, read with its head, registers no timer.
struct DeadlineBody {
    body: Body,
    deadline: Instant,
    /// Started the first time the body is not ready.
    timer: Option<Pin<Box<Sleep>>>,
}

impl DeadlineBody {
    fn new(body: Body, deadline: Instant) -> Self {
        DeadlineBody {
            body,
            deadline,
            timer: None,
        }
    }
}

/// The request body did not arrive within the body timeout.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within the body timeout")]
pub(crate) struct BodyTimedOut;

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(context) {
            return Poll::Ready(frame);
        }
        let deadline = self.deadline;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        ready!(timer.as_mut().poll(context));
        Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
