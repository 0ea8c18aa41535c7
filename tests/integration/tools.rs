//! Tools for the execution tests, unregistered so each test builds exactly the app it needs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use carmy::{Context, JsonSchema, State, ToolError};
use carmy_tests::wait::{PATIENCE, within};
use serde::{Deserialize, Serialize, Serializer};
use tokio::sync::Notify;

/// What the tools did, observed from the test.
#[derive(Clone, Default)]
pub(crate) struct Probe {
    /// How many times a tool body started.
    pub(crate) runs: Arc<AtomicU64>,
    /// Signalled when a tool body starts.
    pub(crate) started: Arc<Notify>,
    /// How many times a slow tool body ran to its end.
    pub(crate) finished: Arc<AtomicU64>,
    /// Signalled when a tool saw its cancellation token fire.
    pub(crate) saw_cancellation: Arc<Notify>,
    /// Executions of the serial tool running right now, and the most seen at once.
    pub(crate) running: Arc<AtomicUsize>,
    pub(crate) most_running: Arc<AtomicUsize>,
}

impl Probe {
    fn start(&self) -> u64 {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        self.started.notify_waiters();
        run
    }

    pub(crate) fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// Waits until tool bodies started `n` times in all; fails the test after [`PATIENCE`].
    pub(crate) async fn wait_runs(&self, n: u64) {
        let started = async {
            loop {
                let notified = self.started.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if self.runs() >= n {
                    return;
                }
                notified.await;
            }
        };
        within(PATIENCE, &format!("tool bodies start {n} times"), started).await;
    }

    /// Sends `request` to `addr` on a connection of its own, and goes away (the request and
    /// its connection dropped) once tool bodies have started `runs` times in all.
    pub(crate) async fn leave_once_it_runs(
        &self,
        addr: SocketAddr,
        request: Request<Body>,
        runs: u64,
    ) {
        let (mut sender, connection) = carmy_tests::connect(addr).await;
        let pending = tokio::spawn(async move {
            let _ = sender.send_request(request).await;
        });
        self.wait_runs(runs).await;
        pending.abort();
        connection.abort();
    }
}

/// An app with every test tool and `probe`.
pub(crate) fn app(probe: &Probe) -> carmy::App {
    carmy::App::new()
        .name("test")
        .tool(echo::TOOL)
        .tool(count::TOOL)
        .tool(slow_write::TOOL)
        .tool(slow_read::TOOL)
        .tool(explode::TOOL)
        .tool(flaky::TOOL)
        .tool(refuse::TOOL)
        .tool(broken_output::TOOL)
        .tool(one_at_a_time::TOOL)
        .tool(picky::TOOL)
        .tool(wipe::TOOL)
        .tool(hand_off::TOOL)
        .tool(explode_later::TOOL)
        .state(probe.clone())
}

#[derive(Debug, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Text {
    /// Any text.
    pub(crate) text: String,
}

/// Returns its input.
#[carmy::tool(effect = "none", idempotent = true, register = false)]
pub(crate) async fn echo(input: Text) -> Result<Text, ToolError> {
    Ok(input)
}

#[derive(Debug, Serialize, JsonSchema)]
pub(crate) struct Run {
    /// Which run of the tool this was.
    pub(crate) run: u64,
}

/// Counts its runs: a non-idempotent write without delay.
#[carmy::tool(effect = "write", register = false)]
pub(crate) async fn count(State(probe): State<Probe>, _input: Text) -> Result<Run, ToolError> {
    Ok(Run { run: probe.start() })
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Wait {
    /// How long to work, in milliseconds.
    pub(crate) millis: u64,
}

async fn work(ctx: &Context, probe: &Probe, millis: u64) -> u64 {
    let run = probe.start();
    // Report cancellation even after this future is dropped.
    let token = ctx.cancellation_token().clone();
    let saw = probe.saw_cancellation.clone();
    tokio::spawn(async move {
        token.cancelled().await;
        saw.notify_one();
    });
    for step in 1..=10 {
        tokio::time::sleep(Duration::from_millis(millis / 10)).await;
        ctx.progress(step, 10, Some(format!("step {step}")));
    }
    probe.finished.fetch_add(1, Ordering::SeqCst);
    run
}

/// A slow non-idempotent write with a 2 s deadline.
#[carmy::tool(effect = "write", timeout = "2s", register = false)]
pub(crate) async fn slow_write(
    ctx: Context,
    State(probe): State<Probe>,
    input: Wait,
) -> Result<Run, ToolError> {
    Ok(Run {
        run: work(&ctx, &probe, input.millis).await,
    })
}

/// A slow idempotent read with a 2 s deadline.
#[carmy::tool(effect = "read", idempotent = true, timeout = "2s", register = false)]
pub(crate) async fn slow_read(
    ctx: Context,
    State(probe): State<Probe>,
    input: Wait,
) -> Result<Run, ToolError> {
    Ok(Run {
        run: work(&ctx, &probe, input.millis).await,
    })
}

/// Panics.
#[carmy::tool(effect = "write", register = false)]
pub(crate) async fn explode(State(probe): State<Probe>) -> Result<Run, ToolError> {
    probe.start();
    panic!("secret panic detail");
}

/// Panics after it first waits.
#[carmy::tool(effect = "write", register = false)]
pub(crate) async fn explode_later(State(probe): State<Probe>) -> Result<Run, ToolError> {
    probe.start();
    tokio::task::yield_now().await;
    panic!("secret panic detail");
}

#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct HandOff {
    /// Whether the tool makes its cancellation token before it ends, or leaves that to the
    /// task it hands its context to.
    pub(crate) token_first: bool,
}

/// Hands its context, or its cancellation token, to a task that outlives the call, and ends
/// at once.
#[carmy::tool(effect = "write", register = false)]
pub(crate) async fn hand_off(
    ctx: Context,
    State(probe): State<Probe>,
    input: HandOff,
) -> Result<Run, ToolError> {
    let saw = probe.saw_cancellation.clone();
    if input.token_first {
        let token = ctx.cancellation_token().clone();
        tokio::spawn(async move {
            token.cancelled().await;
            saw.notify_one();
        });
    } else {
        tokio::spawn(async move {
            ctx.cancellation_token().cancelled().await;
            assert!(ctx.is_cancelled());
            saw.notify_one();
        });
    }
    Ok(Run { run: probe.start() })
}

/// Fails with a retryable error.
#[carmy::tool(effect = "write", register = false)]
pub(crate) async fn flaky(State(probe): State<Probe>) -> Result<Run, ToolError> {
    probe.start();
    Err(
        ToolError::capacity("WAREHOUSE_BUSY", "the warehouse is busy")
            .retryable(Duration::from_millis(1500)),
    )
}

/// Fails with a final error that suggests another tool.
#[carmy::tool(effect = "write", register = false)]
pub(crate) async fn refuse(State(probe): State<Probe>) -> Result<Run, ToolError> {
    probe.start();
    Err(ToolError::conflict("OUT_OF_STOCK", "nothing left").suggest("echo"))
}

/// An output that cannot be serialized.
#[derive(JsonSchema)]
pub(crate) struct Broken;

impl Serialize for Broken {
    fn serialize<S: Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
        Err(serde::ser::Error::custom("broken on purpose"))
    }
}

/// Returns an output that cannot be serialized.
#[carmy::tool(effect = "none", register = false)]
pub(crate) async fn broken_output() -> Result<Broken, ToolError> {
    Ok(Broken)
}

/// Runs one call at a time.
#[carmy::tool(effect = "write", parallel_safe = false, register = false)]
pub(crate) async fn one_at_a_time(State(probe): State<Probe>) -> Result<Run, ToolError> {
    let now = probe.running.fetch_add(1, Ordering::SeqCst) + 1;
    probe.most_running.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    probe.running.fetch_sub(1, Ordering::SeqCst);
    Ok(Run { run: probe.start() })
}

/// Text that the schema allows but the type refuses.
#[derive(Debug, Deserialize, JsonSchema)]
pub(crate) struct Picky {
    /// Anything that does not start with "forbidden".
    #[serde(deserialize_with = "not_forbidden")]
    pub(crate) word: String,
}

fn not_forbidden<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let word = String::deserialize(deserializer)?;
    if word.starts_with("forbidden") {
        // Quotes what it refuses, as serde's own messages do.
        return Err(serde::de::Error::custom(format!(
            "the word {word:?} is forbidden"
        )));
    }
    Ok(word)
}

/// Refuses one word after the schema accepted it.
#[carmy::tool(effect = "write", register = false)]
pub(crate) async fn picky(State(probe): State<Probe>, input: Picky) -> Result<Text, ToolError> {
    probe.start();
    Ok(Text { text: input.word })
}

/// Deletes everything; needs confirmation.
#[carmy::tool(effect = "destructive", confirmation = "required", register = false)]
pub(crate) async fn wipe(ctx: Context, State(probe): State<Probe>) -> Result<Text, ToolError> {
    probe.start();
    Ok(Text {
        text: format!("wiped by {}", ctx.principal().id()),
    })
}
