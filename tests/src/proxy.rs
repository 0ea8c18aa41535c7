//! A TCP proxy in front of a real server, to cut it off or stall it mid-test, and the URL that
//! reaches the server through it.

use std::net::{SocketAddr, ToSocketAddrs};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;

/// A TCP proxy on a loopback port to `target`: forwards every connection until it is paused
/// (bytes are held, connections stay open: a stalled server), cut (open connections drop, new
/// ones are forwarded: a restarted server) or closed (a server gone).
#[derive(Debug)]
pub struct Proxy {
    pub addr: SocketAddr,
    paused: watch::Sender<bool>,
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Forwards every connection made to [`Proxy::addr`] to `target`.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("bound address");
        let (paused, _) = watch::channel(false);
        let (cuts, _) = watch::channel(0);
        let (gate, cut) = (paused.clone(), cuts.clone());
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let gate = gate.subscribe();
                let mut cut = cut.subscribe();
                connections.spawn(async move {
                    if let Ok(outbound) = TcpStream::connect(target).await {
                        let (inbound_read, inbound_write) = inbound.into_split();
                        let (outbound_read, outbound_write) = outbound.into_split();
                        let both = async {
                            tokio::join!(
                                forward(inbound_read, outbound_write, gate.clone()),
                                forward(outbound_read, inbound_write, gate),
                            )
                        };
                        // A cut drops both halves: each side sees its connection end.
                        tokio::select! {
                            _ = both => {}
                            _ = cut.changed() => {}
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            paused,
            cuts,
            task,
        }
    }

    /// Stops forwarding: what either side sends is held until [`Proxy::resume`].
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }

    /// Forwards again, the held bytes first.
    pub fn resume(&self) {
        self.paused.send_replace(false);
    }

    /// Drops every open connection; new ones are forwarded: the server restarted.
    pub fn cut(&self) {
        self.cuts.send_modify(|cuts| *cuts += 1);
    }

    /// Closes the port and every connection through it: the server is gone.
    pub async fn close(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Copies `from` to `to`, holding each chunk while the proxy is paused.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: watch::Receiver<bool>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        if paused.wait_for(|paused| !paused).await.is_err()
            || to.write_all(&buffer[..read]).await.is_err()
        {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// The `host:port` of a `scheme://[user@]host:port/…` URL, and the URL with another one.
pub fn split_authority(url: &str) -> (SocketAddr, impl Fn(SocketAddr) -> String) {
    let (scheme, rest) = url.split_once("://").expect("a URL with an authority");
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, host_port)) => (format!("{user}@"), host_port),
        None => (String::new(), authority),
    };
    let target = host_port
        .to_socket_addrs()
        .expect("host:port resolves")
        .next()
        .expect("an address");
    let (scheme, tail) = (scheme.to_owned(), tail.to_owned());
    (target, move |addr| format!("{scheme}://{user}{addr}{tail}"))
}
