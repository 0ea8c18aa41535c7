//! Servers on loopback sockets, and HTTP/1.1 clients of them.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::Request;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Answer;
use crate::wait::within;

/// A router served on a loopback port for the test's lifetime.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    /// Serves `router` on `127.0.0.1` at a free port.
    pub async fn start(router: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("bound address");
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        Server { addr, task }
    }

    /// Opens a fresh HTTP/1.1 connection. Aborting the returned task closes the socket.
    pub async fn connect(
        &self,
    ) -> (
        hyper::client::conn::http1::SendRequest<Body>,
        JoinHandle<()>,
    ) {
        connect(self.addr).await
    }

    /// Sends `request` on a fresh connection and reads the whole answer.
    pub async fn send(&self, request: Request<Body>) -> Answer {
        send_to(self.addr, request).await
    }

    /// `GET path` with extra headers.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Answer {
        let mut request = Request::get(path).header("host", self.addr.to_string());
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request.body(Body::empty()).expect("valid request"))
            .await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// An app served by `App::serve_with_shutdown`, as `App::serve` serves it (its connection
/// deadlines, peer addresses known), on a loopback port: until [`Serving::stop`], or until it
/// is dropped.
#[derive(Debug)]
pub struct Serving {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), carmy::Error>>,
}

impl Serving {
    /// Serves `app` on `127.0.0.1` at a free port.
    pub async fn start(app: carmy::App) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("bound address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(app.serve_with_shutdown(listener, async move {
            let _ = stopped.await;
        }));
        Serving {
            addr,
            stop: Some(stop),
            task,
        }
    }

    /// Begins the graceful shutdown.
    pub fn stop(&mut self) {
        let stop = self.stop.take().expect("the shutdown begins once");
        stop.send(()).expect("the server is still serving");
    }

    /// Waits for the server to end, which fails the test unless it ends cleanly within `limit`.
    pub async fn ended(mut self, limit: Duration) {
        let task = &mut self.task;
        within(limit, "the server ends", task)
            .await
            .expect("the server's task does not panic")
            .expect("the server ends cleanly");
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Opens a fresh HTTP/1.1 connection to `addr`. Aborting the returned task closes the socket.
pub async fn connect(
    addr: SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Body>,
    JoinHandle<()>,
) {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    (sender, task)
}

/// Sends `request` to `addr` on a fresh connection and reads the whole answer.
pub async fn send_to(addr: SocketAddr, request: Request<Body>) -> Answer {
    let (mut sender, _connection) = connect(addr).await;
    let response = sender.send_request(request).await.expect("response");
    Answer::read(response).await
}

/// `POST /agent/execute` with a JSON body to a server at `addr`, on a fresh connection.
pub async fn execute_at(addr: SocketAddr, body: &Value) -> Answer {
    let request = Request::post("/agent/execute")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("valid request");
    send_to(addr, request).await
}
