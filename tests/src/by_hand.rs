//! HTTP/1.1 by hand over loopback sockets, for what a client library would not send or would
//! hide: requests as raw bytes, answers read to the end, connections the server closes.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::wait::{PATIENCE, within};

/// How long until the server closes `stream` (reads return EOF or fail), up to `limit`.
pub async fn closed_after(stream: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buffer = [0_u8; 1024];
    tokio::time::timeout(limit, async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return start.elapsed(),
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
}

/// Sends `request` as raw bytes on a fresh connection and reads the answer to the end:
/// its status and its body.
pub async fn raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    try_raw(addr, request)
        .await
        .unwrap_or_else(|error| panic!("{addr} is not answered: {error}"))
}

/// [`raw`], giving the error instead of failing the test: for a server that may not be up.
pub async fn try_raw(addr: SocketAddr, request: &[u8]) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    stream.write_all(request).await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(parse_answer(&answer))
}

/// The status and the body of an answer read whole; fails the test unless it is HTTP.
pub fn parse_answer(answer: &[u8]) -> (u16, String) {
    let answer = String::from_utf8_lossy(answer);
    let status = answer
        .get(9..12)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `GET /.well-known/agent`, a request every carmy server answers, closing the connection.
pub const DISCOVERY: &[u8] =
    b"GET /.well-known/agent HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

/// Waits until the server at `addr` has taken every connection made before: it answers one
/// made after them, and a listener takes connections in the order they came.
pub async fn accepted_so_far(addr: SocketAddr) {
    let (status, body) = within(PATIENCE, "the server answers", raw(addr, DISCOVERY)).await;
    assert_eq!(status, 200, "{body}");
}
