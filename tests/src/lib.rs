//! Helpers for the black-box tests: send a request to a router and read the answer.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;

/// An answer, read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: bytes::Bytes,
}

impl Answer {
    /// The body as JSON; panics (failing the test) if it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|error| {
            panic!(
                "body is not JSON ({error}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|value| value.to_str().ok())
    }
}

/// Sends `request` to `router` in-process.
pub async fn send(router: &Router, request: Request<Body>) -> Answer {
    let response: Response<Body> = router
        .clone()
        .oneshot(request)
        .await
        .expect("routers are infallible");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body reads").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// `GET path`.
pub async fn get(router: &Router, path: &str) -> Answer {
    send(
        router,
        Request::get(path)
            .body(Body::empty())
            .expect("valid request"),
    )
    .await
}

/// Hex SHA-256, as carmy's ETags and `tools_version` use.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A router served on a loopback port for the test's lifetime.
#[derive(Debug)]
pub struct Server {
    pub addr: std::net::SocketAddr,
    task: tokio::task::JoinHandle<()>,
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

    /// Opens a fresh HTTP/1.1 connection.
    pub async fn connect(&self) -> hyper::client::conn::http1::SendRequest<Body> {
        let stream = tokio::net::TcpStream::connect(self.addr)
            .await
            .expect("connect");
        let (sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .expect("handshake");
        tokio::spawn(connection);
        sender
    }

    /// Sends `request` on a fresh connection and reads the whole answer.
    pub async fn send(&self, request: Request<Body>) -> Answer {
        let mut sender = self.connect().await;
        let response = sender.send_request(request).await.expect("response");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
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
