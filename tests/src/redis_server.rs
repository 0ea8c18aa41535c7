//! A Redis server of the test's own, for setups the shared one must not be given (TLS,
//! persistence settings): started on a free loopback port, killed when dropped; a database of
//! the test's own on the shared one; temporary directories.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process on `127.0.0.1:port`.
#[derive(Debug)]
pub struct RedisServer {
    pub port: u16,
    child: Child,
}

impl RedisServer {
    /// Starts `redis-server` with `args` (plain on `port`, or `--tls-port` when `tls`), its
    /// files in `dir`; waits until it accepts connections.
    pub fn start(dir: &Path, tls: bool, args: &[&str]) -> Self {
        let port = free_port();
        let port_text = port.to_string();
        let mut command = Command::new("redis-server");
        command.args(["--bind", "127.0.0.1", "--dir"]).arg(dir);
        if tls {
            command.args(["--port", "0", "--tls-port", &port_text]);
        } else {
            command.args(["--port", &port_text]);
        }
        let child = command
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("redis-server runs (the package redis-server provides it)");
        let server = RedisServer { port, child };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nothing listens on (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A private certificate authority and a server certificate it signed for `localhost` and
/// `127.0.0.1`, made with the `openssl` command in `dir`.
#[derive(Debug)]
pub struct Certificates {
    pub ca: PathBuf,
    pub certificate: PathBuf,
    pub key: PathBuf,
}

impl Certificates {
    pub fn make(dir: &Path) -> Self {
        let path = |name: &str| dir.join(name);
        let openssl = |args: &[&str]| {
            let status = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("the openssl command runs");
            assert!(status.success(), "openssl {args:?} failed");
        };
        std::fs::write(
            path("server.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        )
        .expect("write the extensions");
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509"][..],
                &key,
                &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2"],
                &["-subj", "/CN=carmy test CA"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req"][..],
                &key,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=localhost",
                ],
            ]
            .concat(),
        );
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ]);
        Certificates {
            ca: path("ca.crt"),
            certificate: path("server.crt"),
            key: path("server.key"),
        }
    }
}

/// `url` (a Redis server's, with or without a database) naming `database` instead: a test's
/// own namespace on a shared server.
pub fn redis_database(url: &str, database: u32) -> String {
    let base = url.trim_end_matches('/');
    let base = base
        .rsplit_once('/')
        .filter(|(_, db)| db.parse::<u32>().is_ok())
        .map_or(base, |(base, _)| base);
    format!("{base}/{database}")
}

/// A directory of the test's own under the system's temporary directory, removed when dropped.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("carmy-{}-{name}", crate::run_id()));
        std::fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
