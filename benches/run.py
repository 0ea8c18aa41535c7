#!/usr/bin/env python3
"""Reproduces every figure of BENCHMARKS.md in one run.

    python3 benches/run.py [--rounds 3] [--seconds 3]
                           [--only http|memory|profile|micro|scale|check|fuzz]
                           [--scenario execute] [--fuzz-examples 300]
                           [--compare path/to/previous/shop]

End-to-end HTTP: each server pinned to CPU 0, wrk (1 thread, 64 connections) pinned to CPU 1,
over loopback. Targets and scenarios are interleaved (A B C D, A B C D, ...) for several rounds
and the medians reported, each as a ratio to the hand-written axum baseline of the same round.
Memory at equal work: each server answers the same number of `create_order` calls (the shop
keeps every order, so a faster server would otherwise hold more of them). Where the time goes:
`perf` profiles and flamegraphs of the raw handler and carmy, their CPU time per request split by
what it is spent in (`benches/flamegraphs.py`; `--scenario` and `--servers` pick what is
profiled). Then the in-process micro-benchmarks (divan), the scale measurements, the
compile-time cost, and a long schemathesis run against the example's OpenAPI document
(`--only fuzz`).
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import flamegraphs

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
PEERS_TARGET = TARGET / "peers"
LUA = ROOT / "benches" / "wrk" / "request.lua"
CONNECTIONS = 64

CREATE = '{"tool":"create_order","arguments":{"sku":"KB-01"}}'
CREATE_FRESH = '{"tool":"create_order","arguments":{"sku":"KB-01"},"request_id":"{id}"}'
CREATE_REPLAY = '{"tool":"create_order","arguments":{"sku":"KB-01"},"request_id":"replay-1"}'
LIST = '{"tool":"list_products"}'
JSON_HEADERS = "Content-Type: application/json"
# The example's demo token (trust "known"): executions belong to an identified caller.
TOKEN = "Authorization: Bearer shop-known-demo-token"
REPORT = '{"tool":"generate_report","arguments":{"seconds":0}}'
# A path with this in it is the lookup of an execution started just before the measurement.
EXECUTION = "{execution}"
SSE_HEADERS = "Content-Type: application/json\nAccept: text/event-stream"


def mcp_call(tool, arguments):
    return json.dumps({
        "jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}},
    }, separators=(",", ":"))


def mcp_headers(tool):
    return ("Content-Type: application/json\nAccept: application/json, text/event-stream\n"
            f"MCP-Protocol-Version: 2026-07-28\nMcp-Method: tools/call\nMcp-Name: {tool}")


# The `initialize`/`Mcp-Session-Id` generation of MCP: one session per server, opened before the
# measurement; a header value with this in it becomes the session's id.
MCP_SESSION = "{mcp_session}"
SESSION_VERSION = "2025-11-25"
SESSION_HEADERS = ("Content-Type: application/json\nAccept: application/json, text/event-stream\n"
                   f"MCP-Protocol-Version: {SESSION_VERSION}\nMcp-Session-Id: {MCP_SESSION}")


def mcp_session_call(tool, arguments):
    # A session's requests in flight need ids of their own: the SDK answers only one of two
    # with the same id, and the other waits forever.
    return json.dumps({"jsonrpc": "2.0", "id": "{id}", "method": "tools/call",
                       "params": {"name": tool, "arguments": arguments}}, separators=(",", ":"))


def opened_mcp_session(port):
    """Opens an MCP session on the server at `port` as a client does (`initialize`, then
    `notifications/initialized`); returns its id."""
    def post(message, session=None):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if session:
            headers.update({"Mcp-Session-Id": session, "MCP-Protocol-Version": SESSION_VERSION})
        request = urllib.request.Request(f"http://127.0.0.1:{port}/mcp", headers=headers,
                                         data=json.dumps(message).encode())
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            return response.headers.get("Mcp-Session-Id")
    session = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": SESSION_VERSION, "capabilities": {},
        "clientInfo": {"name": "bench", "version": "1"}}})
    if not session:
        raise RuntimeError("initialize answered without an Mcp-Session-Id")
    post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    return session


# scenario -> target -> (method, path, body, headers); a target absent from a scenario does not
# serve it.
def scenarios(etags):
    execute = lambda body, headers=JSON_HEADERS: ("POST", "/agent/execute", body, headers)
    return {
        "execute create_order": {
            "baseline": execute(CREATE), "carmy": execute(CREATE), "carmy 0.6": execute(CREATE),
            # the shipped example counts `/metrics`; the same build with them off
            "carmy, metrics off": execute(CREATE),
        },
        # MCP tools/call, stateless (2026-07-28): the example's `/mcp` against the official SDK's
        # server with the same tool (the baseline serves carmy/1: only the round's reference)
        "MCP tools/call create_order": {
            "baseline": execute(CREATE),
            **{target: ("POST", "/mcp", mcp_call("create_order", {"sku": "KB-01"}), mcp_headers("create_order"))
               for target in ("carmy", "rmcp")},
        },
        # the same call in an MCP session (2025-11-25), against rmcp serving sessions
        "MCP tools/call create_order, session": {
            "baseline": execute(CREATE),
            **{target: ("POST", "/mcp", mcp_session_call("create_order", {"sku": "KB-01"}), SESSION_HEADERS)
               for target in ("carmy", "rmcp, sessions")},
        },
        "execute list_products": {
            "baseline": execute(LIST), "carmy": execute(LIST), "carmy 0.6": execute(LIST),
        },
        "execute, fresh request_id": {
            "baseline": execute(CREATE_FRESH), "carmy": execute(CREATE_FRESH), "carmy 0.6": execute(CREATE_FRESH),
            # the same carmy with its shared and durable idempotency stores
            **{f"carmy, {store}": execute(CREATE_FRESH) for store in STORES},
        },
        "execute, replayed request_id": {
            "baseline": execute(CREATE_REPLAY), "carmy": execute(CREATE_REPLAY), "carmy 0.6": execute(CREATE_REPLAY),
            # every connection retrying the one key: replays must not queue behind each other
            **{f"carmy, {store}": execute(CREATE_REPLAY) for store in STORES},
        },
        "execute as SSE": {
            "baseline": execute(CREATE, SSE_HEADERS), "carmy": execute(CREATE, SSE_HEADERS),
            "carmy 0.6": execute(CREATE, SSE_HEADERS),
        },
        # protocol.md §9, against the synchronous call of the same tool in the same run (the
        # baseline serves create_order: its figure is only the round's reference)
        "executions: sync generate_report": {
            "baseline": execute(CREATE), "carmy": execute(REPORT, f"{JSON_HEADERS}\n{TOKEN}"),
        },
        "executions: 202 start": {
            "baseline": execute(CREATE),
            "carmy": execute(REPORT, f"{JSON_HEADERS}\nPrefer: respond-async\n{TOKEN}"),
        },
        "executions: lookup": {
            "baseline": execute(CREATE),
            "carmy": ("GET", f"/agent/executions/{EXECUTION}", None, TOKEN),
        },
        "catalog 304": {
            target: ("GET", "/agent/tools", None, f"If-None-Match: {etag}")
            for target, etag in etags.items()
        },
        "catalog 200": {target: ("GET", "/agent/tools", None, "") for target in etags},
    }


# The idempotency stores the shop can use (`CARMY_IDEMPOTENCY_URL`), on this machine's servers.
STORES = {
    "postgres": "postgres://postgres@127.0.0.1:5432/test",
    "redis": "redis://127.0.0.1:6379",
    "file": "file:{tmp}/carmy-bench-idempotency.redb",
}

SERVERS = {
    "baseline": lambda: [str(TARGET / "release" / "examples" / "baseline")],
    "carmy": lambda: [str(TARGET / "release" / "shop")],
    "carmy 0.6": lambda: [str(PEERS_TARGET / "release" / "carmy06")],
    "rmcp": lambda: [str(PEERS_TARGET / "release" / "rmcp_shop")],
    "rmcp, sessions": lambda: [str(PEERS_TARGET / "release" / "rmcp_shop"), "--sessions"],
    **{f"carmy, {store}": lambda: [str(TARGET / "release" / "shop")] for store in STORES},
    "carmy, metrics off": lambda: [str(TARGET / "release" / "shop")],
}
PORT = 3100
# `--compare BIN`: another build of the example (e.g. the previous commit's), measured beside
# today's in every scenario the example serves.
PREVIOUS = "carmy (previous)"


def run(command, **kwargs):
    print("$", " ".join(command), file=sys.stderr)
    return subprocess.run(command, check=True, **kwargs)


def build():
    run(["cargo", "build", "--release", "-p", "shop", "-p", "carmy-benches", "--bins", "--example", "baseline"], cwd=ROOT)
    env = dict(os.environ, CARGO_TARGET_DIR=str(PEERS_TARGET))
    run(["cargo", "build", "--release", "--manifest-path", str(ROOT / "benches/peers/Cargo.toml")], cwd=ROOT, env=env)


class Server:
    def __init__(self, target):
        # The example as shipped, its default logging going to a file as a deployment's would;
        # only the shipped budget of 60 anonymous calls a minute is lifted.
        env = dict(os.environ, CARMY_ADDR=f"127.0.0.1:{PORT}", CARMY_RATE_LIMIT_ANONYMOUS="1000000000",
                   CARMY_RATE_LIMIT_KNOWN="1000000000")
        env.pop("RUST_LOG", None)
        env.pop("CARMY_IDEMPOTENCY_URL", None)
        store = target.removeprefix("carmy, ")
        if store in STORES:
            env["CARMY_IDEMPOTENCY_URL"] = STORES[store].format(tmp=tempfile.mkdtemp())
        if target == "carmy, metrics off":
            env["CARMY_METRICS_ENABLED"] = "false"
        self.log = tempfile.TemporaryFile()
        self.process = subprocess.Popen(["taskset", "-c", "0", *SERVERS[target]()], env=env,
                                        stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/agent/tools", timeout=1)
                return
            except urllib.error.HTTPError:
                return  # it answers (rmcp has no catalog route)
            except Exception:
                time.sleep(0.02)
        raise RuntimeError(f"{target} did not start")

    def peak_rss_mib(self):
        return self.status_mib("VmHWM")

    def anon_rss_mib(self):
        """Anonymous memory (heap, stacks, relocated data) now: the part of the RSS a server's
        work makes, without the pages of its executable and libraries that the peak also counts.
        Read right after the load, it is close to the anonymous peak: freed heap stays mapped."""
        return self.status_mib("RssAnon")

    def status_mib(self, field):
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) / 1024

    def cpu_seconds(self):
        """User and system time the server has used so far (`/proc/PID/stat`, fields 14–15)."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.log.close()


def wrk(method, path, body, headers, seconds):
    env = dict(os.environ, BENCH_METHOD=method, BENCH_PATH=path, BENCH_HEADERS=headers)
    if body is not None:
        # a `{id}` unique to this run too: a shared store keeps the records of earlier runs
        env["BENCH_BODY"] = body.replace("{id}", f"{time.time_ns()}-{{id}}")
    output = subprocess.run(
        ["taskset", "-c", "1", "wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "--latency",
         "-s", str(LUA), f"http://127.0.0.1:{PORT}{path}"],
        env=env, check=True, capture_output=True, text=True).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))
    requests = int(re.search(r"(\d+) requests in", output).group(1))
    latency = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", output, re.M))
    non2xx = int(re.search(r"non2xx: (\d+)", output).group(1))
    return {"rps": rps, "requests": requests, "p50": to_ms(latency["50"]), "p99": to_ms(latency["99"]),
            "non2xx": non2xx}


def to_ms(text):
    value, unit = re.match(r"([\d.]+)(\w+)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1, "s": 1000}[unit]


def started_execution():
    """Starts one execution asynchronously on the running server; returns its id."""
    name, value = TOKEN.split(": ", 1)
    request = urllib.request.Request(f"http://127.0.0.1:{PORT}/agent/execute", data=REPORT.encode(),
                                     headers={"Content-Type": "application/json", name: value,
                                              "Prefer": "respond-async"})
    with urllib.request.urlopen(request) as response:
        return json.load(response)["execution_id"]


def etag_of(target):
    server = Server(target)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/agent/tools") as response:
            return response.headers["ETag"]
    finally:
        server.stop()


def selected(wanted_scenarios, wanted_servers):
    """The scenarios whose name contains one of `wanted_scenarios` (all when none), each with
    the baseline and `wanted_servers` (all when none)."""
    # Only the catalog's scenarios need each server's ETag, and reading it starts the server.
    wants_catalog = not wanted_scenarios or any(
        wanted in name for wanted in wanted_scenarios for name in ("catalog 304", "catalog 200"))
    etags = {target: etag_of(target) for target in ["baseline", "carmy", "carmy 0.6"]
             if wants_catalog and (not wanted_servers or target in wanted_servers or target == "baseline")}
    table = scenarios(etags)
    if wanted_scenarios:
        table = {name: targets for name, targets in table.items()
                 if any(wanted in name for wanted in wanted_scenarios)}
    if wanted_servers:
        table = {name: {target: request for target, request in targets.items()
                        if target in wanted_servers or target == "baseline"}
                 for name, targets in table.items()}
    return table


def measure(args):
    table = selected(args.scenario, args.servers)
    if args.compare:
        for name, targets in table.items():
            if name == "catalog 304":
                targets[PREVIOUS] = ("GET", "/agent/tools", None, f"If-None-Match: {etag_of(PREVIOUS)}")
            elif "carmy" in targets:
                targets[PREVIOUS] = targets["carmy"]
    results = {}  # (scenario, target) -> list of runs
    for round_index in range(args.rounds):
        for scenario, targets in table.items():
            for target, (method, path, body, headers) in targets.items():
                server = Server(target)
                try:
                    if EXECUTION in path:
                        path = path.replace(EXECUTION, started_execution())
                    if MCP_SESSION in headers:
                        headers = headers.replace(MCP_SESSION, opened_mcp_session(PORT))
                    wrk(method, path, body, headers, 1)  # warm-up
                    cpu_before = server.cpu_seconds()
                    result = wrk(method, path, body, headers, args.seconds)
                    # server CPU per answered request, in microseconds
                    result["cpu"] = (server.cpu_seconds() - cpu_before) * 1e6 / max(result["requests"], 1)
                    result["rss"] = server.peak_rss_mib()
                    result["anon"] = server.anon_rss_mib()
                finally:
                    server.stop()
                results.setdefault((scenario, target), []).append(result)
                print(f"round {round_index + 1} {scenario:32} {target:10} {result['rps']:>10.0f} req/s "
                      f"p50 {result['p50']:.2f} ms p99 {result['p99']:.2f} ms cpu {result['cpu']:.1f} µs "
                      f"rss {result['rss']:.1f} MiB anon {result['anon']:.1f} MiB "
                      f"non-2xx {result['non2xx']}", file=sys.stderr)
    return table, results


# Calls each server answers for the memory at equal work: about what carmy 0.6.1 answers in 3 s.
MEMORY_REQUESTS = 150_000


def memory(args):
    """Peak RSS after the same number of `create_order` calls, split into anonymous memory (the
    heap: the shop's orders, the connections) and the pages of the executable and libraries."""
    targets = ["baseline", "carmy", "carmy 0.6"] + ([PREVIOUS] if args.compare else [])
    env = dict(os.environ, BENCH_METHOD="POST", BENCH_PATH="/agent/execute", BENCH_BODY=CREATE,
               BENCH_HEADERS=JSON_HEADERS, BENCH_REQUESTS=str(MEMORY_REQUESTS))
    results = {}
    for _ in range(args.rounds):
        for target in targets:
            server = Server(target)
            try:
                # wrk leaves at the last answer; the duration only bounds a server that stalls
                subprocess.run(["taskset", "-c", "1", "wrk", "-t1", f"-c{CONNECTIONS}", "-d60s", "-s", str(LUA),
                                f"http://127.0.0.1:{PORT}/agent/execute"],
                               env=env, check=True, capture_output=True)
                result = {field: server.status_mib(field) for field in ("VmHWM", "RssAnon", "RssFile")}
            finally:
                server.stop()
            results.setdefault(target, []).append(result)
            print(f"memory {target:10} " + " ".join(f"{k} {v:.1f} MiB" for k, v in result.items()), file=sys.stderr)
    lines = [f"{MEMORY_REQUESTS:,} `create_order` calls each; medians of {args.rounds} rounds.\n",
             "| server | peak RSS MiB | ×carmy 0.6.1 | anon RSS MiB | file RSS MiB |", "|---|---:|---:|---:|---:|"]
    median = lambda target, field: statistics.median(run[field] for run in results[target])
    for target in targets:
        lines.append(f"| {target} | {median(target, 'VmHWM'):.1f} | "
                     f"{median(target, 'VmHWM') / median('carmy 0.6', 'VmHWM'):.2f} | "
                     f"{median(target, 'RssAnon'):.1f} | {median(target, 'RssFile'):.1f} |")
    return "\n".join(lines)


def report_http(table, results):
    # The rounds' spread beside each median ratio: on a shared 2-vCPU machine one round's ratio
    # moves by several hundredths, as much as a change of a few percent in the code.
    lines = ["| scenario | server | req/s | ×baseline | rounds | CPU µs/req | ×baseline CPU | rounds | "
             "p50 ms | p99 ms | peak RSS MiB | ×baseline RSS | anon RSS MiB | non-2xx |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for scenario, targets in table.items():
        # ratios per round, against the baseline of the same round, then the median
        base = results[(scenario, "baseline")]
        for target in targets:
            runs = results[(scenario, target)]
            median = lambda key: statistics.median(run[key] for run in runs)
            ratios = [run["rps"] / b["rps"] for run, b in zip(runs, base)]
            rss_ratio = statistics.median(run["rss"] / b["rss"] for run, b in zip(runs, base))
            # ≥ 1 is better: the baseline's CPU per request over this server's
            cpu_ratios = [b["cpu"] / run["cpu"] for run, b in zip(runs, base)]
            lines.append(f"| {scenario} | {target} | {median('rps'):,.0f} | {statistics.median(ratios):.2f} | "
                         f"{spread(ratios)} | {median('cpu'):.1f} | {statistics.median(cpu_ratios):.2f} | "
                         f"{spread(cpu_ratios)} | {median('p50'):.2f} | "
                         f"{median('p99'):.2f} | {median('rss'):.1f} | {rss_ratio:.2f} | {median('anon'):.1f} | "
                         f"{sum(r['non2xx'] for r in runs)} |")
    return "\n".join(lines)


def spread(ratios):
    """The lowest and highest of the rounds' ratios.

    >>> spread([0.91, 0.84, 0.88])
    '0.84–0.91'
    """
    return f"{min(ratios):.2f}–{max(ratios):.2f}"


def micro():
    output = run(["cargo", "bench", "-p", "carmy-benches", "--bench", "micro"], cwd=ROOT,
                 capture_output=True, text=True).stdout
    return output


def scale():
    output = run([str(TARGET / "release" / "scale")], cwd=ROOT, capture_output=True, text=True).stdout
    return output


def check_cost(tools=200):
    """`cargo check` time of a crate of `tools` tools vs the same crate of plain async fns."""
    base = TARGET / "check-cost"
    times = {}
    for kind in ["plain", "tools"]:
        crate = base / kind
        (crate / "src").mkdir(parents=True, exist_ok=True)
        (crate / "Cargo.toml").write_text(f"""[package]
name = "check-cost-{kind}"
version = "0.0.0"
edition = "2024"
publish = false
[workspace]
[dependencies]
carmy = {{ path = "{ROOT / 'carmy'}" }}
serde = {{ version = "1", features = ["derive"] }}
tokio = {{ version = "1", features = ["rt"] }}
""")
        items = []
        for n in range(tools):
            attribute = f'#[carmy::tool(effect = "read", idempotent = true)]\n' if kind == "tools" else ""
            items.append(f"""
#[derive(serde::Deserialize, carmy::JsonSchema)]
pub struct Input{n} {{
    /// The id.
    pub id: u64,
    /// The name.
    pub name: String,
}}
#[derive(serde::Serialize, carmy::JsonSchema)]
pub struct Output{n} {{
    pub ok: bool,
}}
/// Tool number {n}.
{attribute}pub async fn tool_{n}(input: Input{n}) -> Result<Output{n}, carmy::ToolError> {{
    Ok(Output{n} {{ ok: input.id > 0 && !input.name.is_empty() }})
}}
""")
        (crate / "src" / "lib.rs").write_text("#![allow(dead_code)]\n" + "".join(items))
        env = dict(os.environ, CARGO_TARGET_DIR=str(base / "target"))
        lockfile = ROOT / "Cargo.lock"
        shutil.copy(lockfile, crate / "Cargo.lock")
        run(["cargo", "check", "-q"], cwd=crate, env=env)  # dependencies, once
        samples = []
        for _ in range(3):
            (crate / "src" / "lib.rs").touch()
            started = time.perf_counter()
            run(["cargo", "check", "-q"], cwd=crate, env=env)
            samples.append(time.perf_counter() - started)
        times[kind] = statistics.median(samples)
    per_tool_ms = (times["tools"] - times["plain"]) / tools * 1000
    return (f"| crate | `cargo check` s |\n|---|---:|\n| {tools} plain async fns | {times['plain']:.2f} |\n"
            f"| {tools} `#[carmy::tool]` fns | {times['tools']:.2f} |\n\n"
            f"Macro cost: **{per_tool_ms:.1f} ms per tool** (target ≤ 10 ms).")


OPENAPI_TOOLS = ROOT / "tests" / "openapi-tools" / "requirements.txt"


def openapi_venv():
    """The virtualenv of openapi-spec-validator and schemathesis that .ci/run keeps
    (`CARMY_OPENAPI_VENV`), made here when it is missing or its pins changed."""
    venv = Path(os.environ.get("CARMY_OPENAPI_VENV", "/var/cache/carmy/openapi-venv"))
    pinned = venv / "requirements.txt"
    if not pinned.exists() or pinned.read_bytes() != OPENAPI_TOOLS.read_bytes():
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
             "-r", str(OPENAPI_TOOLS)])
        shutil.copy(OPENAPI_TOOLS, pinned)
    return venv


def fuzz(max_examples):
    """The CI run of tests/integration/openapi.rs, longer: fresh seeds, `max_examples` per
    operation, the stateful phase too, as an internal and as an anonymous caller. A failure is a
    carmy bug; the run stops the script with schemathesis' report."""
    schemathesis = str(openapi_venv() / "bin" / "schemathesis")
    url = f"http://127.0.0.1:{PORT}/agent/openapi.json"
    lines = []
    for caller, headers in [("internal", ["-H", "Authorization: Bearer shop-internal-demo-token"]),
                            ("anonymous", [])]:
        server = Server("carmy")
        try:
            started = time.time()
            # `generate_report` works at most 10 s: any valid call answers within 15 s. No
            # subscriptions: one would send events to whatever its fuzzed URL resolves to.
            output = subprocess.run(
                [schemathesis, "--no-color", "run", url, "--checks", "all", "--max-examples",
                 str(max_examples), "--request-timeout", "15", "--max-response-time", "15",
                 "--generation-database", "none", "--exclude-path-regex", "^/agent/events/",
                 *headers],
                capture_output=True, text=True, cwd=tempfile.mkdtemp())
        finally:
            server.stop()
        summary = re.search(r"(\d+) generated, .*", output.stdout)
        seed = re.search(r"Seed: (\d+)", output.stdout)
        if output.returncode != 0:
            print(output.stdout, output.stderr, file=sys.stderr)
            raise RuntimeError(f"schemathesis found failures as the {caller} caller")
        lines.append(f"| {caller} | {summary.group(0) if summary else '?'} | "
                     f"{time.time() - started:.0f} s | {seed.group(1) if seed else '?'} |")
    return ("| caller | test cases | time | seed |\n|---|---|---|---|\n" + "\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--skip-build", action="store_true")
    parser.add_argument("--only", choices=["http", "memory", "micro", "scale", "check", "fuzz", "profile"],
                        action="append")
    parser.add_argument("--fuzz-examples", type=int, default=300,
                        help="schemathesis test cases per operation and phase (--only fuzz)")
    parser.add_argument("--scenario", action="append",
                        help="run only the HTTP scenarios whose name contains this (repeatable)")
    parser.add_argument("--servers", action="append",
                        help="measure only these servers beside the baseline (repeatable)")
    parser.add_argument("--compare", metavar="BIN",
                        help="another build of the example to measure beside today's")
    args = parser.parse_args()
    parts = set(args.only or ["http", "memory", "profile", "micro", "scale", "check", "fuzz"])
    if args.compare:
        SERVERS[PREVIOUS] = lambda: [str(Path(args.compare).resolve())]
    if not args.skip_build:
        build()
    out = [f"Machine: {os.cpu_count()} CPUs, {platform_line()}"]
    if "http" in parts:
        table, results = measure(args)
        out.append("## End-to-end HTTP\n\n" + report_http(table, results))
    if "memory" in parts:
        out.append("## Memory at equal work\n\n" + memory(args))
    if "micro" in parts:
        out.append("## Micro-benchmarks (divan)\n\n```\n" + micro() + "```")
    if "scale" in parts:
        out.append("## Scale\n\n" + scale())
    if "check" in parts:
        out.append("## Compile-time cost\n\n" + check_cost())
    if "profile" in parts:
        table = selected(args.scenario or flamegraphs.DEFAULT_SCENARIOS, args.servers or ["carmy"])
        out.append("## Where the microseconds go (perf, flamegraphs)\n\n"
                   + flamegraphs.profile(args, table, Server, wrk, TARGET))
    if "fuzz" in parts:
        out.append("## schemathesis against the OpenAPI document\n\n" + fuzz(args.fuzz_examples))
    print("\n\n".join(out))


def platform_line():
    model = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text())
    return model.group(1) if model else "unknown CPU"


if __name__ == "__main__":
    main()
