//! Programs outside the test process: the example as shipped, and the clients and tools that
//! drive it.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::wait::{PATIENCE, eventually, within};

/// The example as shipped (`CARMY_SHOP_BIN`, with its `carmy.toml`) on a loopback port, with
/// `envs` set besides; killed when dropped.
#[derive(Debug)]
pub struct ShippedShop {
    child: std::process::Child,
    pub addr: SocketAddr,
}

impl ShippedShop {
    pub async fn start(program: &Path, envs: &[(&str, &OsStr)]) -> Self {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap();
        let child = std::process::Command::new(program)
            .env("CARMY_ADDR", addr.to_string())
            .env("RUST_LOG", "warn")
            .env_remove("CARMY_IDEMPOTENCY_URL")
            .env_remove("CARMY_CONFIG")
            .envs(envs.iter().copied())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| panic!("{program:?} cannot start: {error}"));
        let shop = ShippedShop { child, addr };
        eventually(
            PATIENCE,
            &format!("the shop listens on {addr}"),
            async || tokio::net::TcpStream::connect(addr).await.is_ok(),
        )
        .await;
        shop
    }
}

impl Drop for ShippedShop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How long an outside program may run: each bounds its own work (the MCP clients give up
/// after 60 s, schemathesis runs a fixed number of examples), so this only ends a hang.
const PROGRAM_LIMIT: Duration = Duration::from_secs(600);

/// Runs an outside program (an MCP client, a fuzzer, the browser test) in `dir` to its end;
/// fails the test with everything it printed unless it succeeds within [`PROGRAM_LIMIT`], else
/// prints its output.
pub async fn run_to_success(program: impl AsRef<OsStr>, args: &[&OsStr], dir: &Path) {
    let mut command = tokio::process::Command::new(program.as_ref());
    command
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let shown = format!("{:?}", command.as_std());
    let output = within(PROGRAM_LIMIT, &format!("{shown} ends"), command.output())
        .await
        .unwrap_or_else(|error| panic!("{shown} cannot start: {error}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{shown} failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    println!("{stdout}");
}
