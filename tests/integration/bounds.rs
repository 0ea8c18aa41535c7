//! Memory bounds on the request path: progress to a client that stops reading, and
//! error bodies that never echo a large input.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use carmy::{Context, JsonSchema, State, ToolError};
use carmy_tests::{Server, execute};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Set when `chatter` has emitted all its progress.
#[derive(Clone, Default)]
struct Done(Arc<AtomicBool>);

#[derive(Deserialize, JsonSchema)]
struct Chatter {
    count: u64,
}

#[derive(Serialize, JsonSchema)]
struct Emitted {
    emitted: u64,
}

/// Reports `count` progress events as fast as it can.
#[carmy::tool(effect = "none", timeout = "60s", register = false)]
async fn chatter(
    ctx: Context,
    State(done): State<Done>,
    input: Chatter,
) -> Result<Emitted, ToolError> {
    for step in 1..=input.count {
        ctx.progress(step, input.count, format!("step {step} of the work"));
        if step % 4096 == 0 {
            tokio::task::yield_now().await;
        }
    }
    done.0.store(true, Ordering::SeqCst);
    Ok(Emitted {
        emitted: input.count,
    })
}

#[derive(Serialize, Deserialize, JsonSchema)]
struct Note {
    note: String,
}

/// Needs the user's confirmation; takes an argument a caller can make large.
#[carmy::tool(effect = "destructive", confirmation = "required", register = false)]
async fn erase(input: Note) -> Result<Note, ToolError> {
    Ok(input)
}

fn app(done: &Done) -> carmy::App {
    carmy::App::new()
        .name("bounds")
        .tool(chatter::TOOL)
        .tool(erase::TOOL)
        .tool(crate::tools::echo::TOOL)
        .state(done.clone())
}

/// The resident set of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

const EVENTS: u64 = 1_000_000;

/// Sends `head` and `body` on a raw socket, then reads nothing until the tool is done; returns
/// the growth of the resident set meanwhile (printed: other tests share the process, so it is
/// a figure, not the assertion) and the socket.
async fn stall(
    addr: std::net::SocketAddr,
    done: &Done,
    head: &str,
    body: &str,
) -> (u64, TcpStream) {
    done.0.store(false, Ordering::SeqCst);
    let before = rss();
    let mut socket = TcpStream::connect(addr).await.unwrap();
    let request = format!("{head}content-length: {}\r\n\r\n{body}", body.len());
    socket.write_all(request.as_bytes()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), async {
        while !done.0.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the tool finishes although its client does not read");
    // Let the runtime hand the answer over.
    tokio::time::sleep(Duration::from_millis(200)).await;
    (rss().saturating_sub(before), socket)
}

/// Reads from `socket` until `needle` and the end of its line arrived; returns all read.
async fn read_until(socket: &mut TcpStream, needle: &str) -> String {
    let mut received = Vec::new();
    let mut buffer = vec![0; 64 * 1024];
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let read = socket.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the connection closed before the answer");
            received.extend_from_slice(&buffer[..read]);
            let text = String::from_utf8_lossy(&received);
            if let Some(at) = text.find(needle)
                && text[at..].contains('\n')
            {
                return;
            }
        }
    })
    .await
    .expect("the answer arrives");
    String::from_utf8_lossy(&received).into_owned()
}

/// What may reach a client that read nothing while the tool ran: the socket buffers (a few
/// MiB on loopback, under 100,000 events) and carmy's bounded queue. Without a bound, all
/// 1,000,000 events wait in memory for it (+94 MiB of resident set here) and are delivered.
const MOST_DELIVERED: usize = 200_000;

/// One test for both transports, so the two measures do not overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_to_a_client_that_stops_reading_is_bounded() {
    let done = Done::default();
    let server = Server::start(app(&done).router().unwrap()).await;

    // carmy/1 over SSE.
    let body = json!({ "tool": "chatter", "arguments": { "count": EVENTS } }).to_string();
    let head = "POST /agent/execute HTTP/1.1\r\nhost: localhost\r\n\
                content-type: application/json\r\naccept: text/event-stream\r\n";
    let (growth, mut socket) = stall(server.addr, &done, head, &body).await;
    eprintln!(
        "SSE: {EVENTS} progress events, resident set grew by {} KiB",
        growth / 1024
    );
    let text = read_until(&mut socket, "event: execution.completed").await;
    let received = text.matches("event: tool.progress").count();
    eprintln!("SSE: {received} progress events delivered");
    assert!(
        received < MOST_DELIVERED,
        "SSE: {received} events were kept for the client"
    );
    let completed = text.rsplit("event: execution.completed").next().unwrap();
    assert!(
        completed.contains("\"data\":{\"emitted\":1000000}"),
        "{completed}"
    );
    // The last report is never coalesced away.
    let last_progress = text.rsplit("event: tool.progress").next().unwrap();
    assert!(
        last_progress.contains("\"progress\":1000000"),
        "{last_progress}"
    );

    // MCP with a progress token.
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {
            "name": "chatter",
            "arguments": { "count": EVENTS },
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
                "progressToken": "p-1",
            },
        },
    })
    .to_string();
    let head = "POST /mcp HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
                accept: application/json, text/event-stream\r\n\
                mcp-protocol-version: 2026-07-28\r\nmcp-method: tools/call\r\nmcp-name: chatter\r\n";
    let (growth, mut socket) = stall(server.addr, &done, head, &body).await;
    eprintln!(
        "MCP: {EVENTS} progress events, resident set grew by {} KiB",
        growth / 1024
    );
    let text = read_until(&mut socket, "\"structuredContent\"").await;
    let received = text.matches("notifications/progress").count();
    eprintln!("MCP: {received} progress notifications delivered");
    assert!(
        received < MOST_DELIVERED,
        "MCP: {received} events were kept for the client"
    );
    assert!(text.contains("\"structuredContent\":{\"emitted\":1000000}"));
}

/// Every error body stays under 16 KiB, however large what the caller sent.
#[tokio::test]
async fn error_bodies_never_echo_large_inputs() {
    const MAX_BODY: usize = 16 * 1024;
    let router = app(&Done::default()).router().unwrap();
    let big = "x".repeat(200 * 1024);
    let cases = [
        // A large value of the wrong type.
        (
            "value",
            json!({ "tool": "echo", "arguments": { "text": [big] } }),
            "INVALID_ARGUMENTS",
        ),
        // A large argument name.
        (
            "argument name",
            json!({ "tool": "echo", "arguments": { "text": "a", big.clone(): 1 } }),
            "INVALID_ARGUMENTS",
        ),
        // A large tool name.
        ("tool name", json!({ "tool": big }), "TOOL_NOT_FOUND"),
        // A large unknown request field.
        (
            "request field",
            json!({ "tool": "echo", big.clone(): 1 }),
            "INVALID_REQUEST",
        ),
        // A large request_id.
        (
            "request_id",
            json!({ "tool": "echo", "arguments": { "text": "a" }, "request_id": big }),
            "INVALID_REQUEST",
        ),
        // A large value under a large name, nested.
        (
            "nested",
            json!({ "tool": "echo", "arguments": { "text": { big.clone(): big } } }),
            "INVALID_ARGUMENTS",
        ),
        // Many small violations.
        (
            "many names",
            json!({ "tool": "echo", "arguments": (0..20_000)
                .map(|index| (format!("field_{index}"), json!(index)))
                .collect::<serde_json::Map<_, _>>() }),
            "INVALID_ARGUMENTS",
        ),
        // A call that needs confirmation repeats its arguments in a suggestion.
        (
            "suggested call",
            json!({ "tool": "erase", "arguments": { "note": big } }),
            "CONFIRMATION_REQUIRED",
        ),
    ];
    for (what, body, code) in cases {
        let answer = execute(&router, &body).await;
        eprintln!("{what}: an error body of {} bytes", answer.body.len());
        assert_eq!(answer.json()["error"]["code"], code, "{what}");
        assert!(
            answer.body.len() < MAX_BODY,
            "{what}: an error body of {} bytes",
            answer.body.len()
        );
    }
    // A small confirmation call still repeats its arguments.
    let answer = execute(
        &router,
        &json!({ "tool": "erase", "arguments": { "note": "n" } }),
    )
    .await;
    assert_eq!(
        answer.json()["_agent"]["next_actions"][0]["arguments"],
        json!({ "note": "n" })
    );
    // Clipped, a long value still reads as what it was.
    let answer = execute(&router, &json!({ "tool": big })).await;
    let shown = answer.json()["error"]["details"]["tool"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(shown.starts_with("xxxx") && shown.ends_with('…'), "{shown}");
}
