//! The router as hyper calls it for one connection: the peer's address on every request, and
//! the requests in flight counted for the connection's watch.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Extensions, Request, Response, Version};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use super::connection::{Activity, InFlight};

/// The router, for one connection: adds the peer address (`ConnectInfo`, which also keys an
/// anonymous caller's rate limit) and counts the requests in flight, each until its response body is done.
#[derive(Clone)]
pub(super) struct ConnectionService {
    pub(super) router: Router,
    /// What every request of the connection starts with ([`connection_extensions`]).
    pub(super) extensions: Extensions,
    pub(super) activity: Arc<Activity>,
}

/// The extensions each request of a connection from `peer` starts with: `ConnectInfo`, in a
/// map with room for those the router and the gate add. A map made by the first insert holds
/// three entries and is rebuilt at the fourth, and a request carries four; a clone keeps the
/// room of its original.
pub(super) fn connection_extensions(peer: SocketAddr) -> Extensions {
    /// Stand-ins that make the room: `MatchedPath`, the path's parameters, `Admitted`.
    #[derive(Clone)]
    struct Room<const SLOT: u8>;
    let mut extensions = Extensions::new();
    extensions.insert(ConnectInfo(peer));
    extensions.insert(Room::<0>);
    extensions.insert(Room::<1>);
    extensions.insert(Room::<2>);
    extensions.remove::<Room<0>>();
    extensions.remove::<Room<1>>();
    extensions.remove::<Room<2>>();
    extensions
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        if request.version() == Version::HTTP_2 {
            self.activity.multiplexed();
        }
        request.extensions_mut().extend(self.extensions.clone());
        ResponseFuture {
            in_flight: Some(InFlight::start(&self.activity)),
            response: tower::ServiceExt::oneshot(self.router.clone(), request),
        }
    }
}

pin_project_lite::pin_project! {
    /// The router's answer to one request, which stays in flight until its body has been
    /// handed to hyper.
    pub(super) struct ResponseFuture {
        #[pin]
        response: tower::util::Oneshot<Router, Request<Incoming>>,
        in_flight: Option<InFlight>,
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.response.poll(context))?;
        // A body of known length goes to hyper whole, with the head: the request ends with
        // it. One that streams (events) keeps the request in flight until it ends.
        Poll::Ready(Ok(match this.in_flight.take() {
            Some(in_flight) if response.body().size_hint().exact().is_none() => {
                response.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        let _in_flight = &in_flight;
                        frame
                    }))
                })
            }
            _ => response,
        }))
    }
}
