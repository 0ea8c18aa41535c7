#!/usr/bin/env python3
"""Server instructions per request, counted by callgrind: repeatable whatever else the machine
is doing, so two builds compare exactly even on a loaded machine (wall-clock req/s does not).

    python3 benches/instructions.py BIN [BIN ...] [--path /agent/execute] [--body JSON]
                                    [--header 'Name: value'] [--config carmy.toml] [--subscribe]
                                    [--mcp-session]

Each binary (the example, `shop`, of some build; a peer with its arguments, quoted as one:
`'rmcp_shop --sessions'`) runs under `valgrind --tool=callgrind`; one keep-alive client sends
the same request SMALL times, then LARGE times in a second run; the difference of the two
totals divided by LARGE - SMALL is the cost of one request, start-up and shutdown cancelled
out. A `{id}` in the body becomes a number unique to each request (a fresh
`request_id`). `--subscribe` first subscribes a receiver (a thread of this script on 127.0.0.1,
answering 204) to `execution.finished` as the example's internal caller, allowing loopback for
it as a test configuration would: the cost of writing and delivering the events is counted.
`--mcp-session` counts MCP `tools/call create_order` in a session (2025-11-25), opened as
`benches/run.py` opens it. Loopback only.
"""

import argparse
import http.client
import http.server
import json
import os
import re
import shlex
import signal
import subprocess
import tempfile
import threading
import time

from run import MCP_SESSION, SESSION_HEADERS, mcp_session_call, opened_mcp_session

PORT = int(os.environ.get("BENCH_PORT", "3190"))  # another port runs two counts at once
# Valgrind counts each iteration of `rep movsb` as an instruction, and glibc's memcpy takes
# `rep movsb` for a large copy depending on its size and its addresses: the 16 KiB moves of
# rmcp's per-request task counted 117k instructions a call in one build and 12k in another that
# copied as much. With the threshold out of reach every copy takes the vector loop, counted by
# the 32 bytes, whatever the addresses.
GLIBC_TUNABLES = "glibc.cpu.x86_rep_movsb_threshold=0x100000"
SMALL, LARGE = 200, 1200


class Receiver(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def subscribe(connection, receiver_port):
    body = json.dumps({"url": f"http://127.0.0.1:{receiver_port}/hook",
                       "event_types": ["execution.finished"]})
    connection.request("POST", "/agent/events/subscriptions", body=body, headers={
        "Content-Type": "application/json", "Authorization": "Bearer shop-internal-demo-token"})
    response = connection.getresponse()
    response.read()
    if response.status != 201:
        raise RuntimeError(f"subscribing: {response.status}")


def count(binary, requests, method, path, body, headers, config, receiver_port):
    out = tempfile.NamedTemporaryFile(prefix="callgrind-", suffix=".out", delete=False).name
    env = dict(os.environ, CARMY_ADDR=f"127.0.0.1:{PORT}", GLIBC_TUNABLES=GLIBC_TUNABLES,
               CARMY_RATE_LIMIT_ANONYMOUS="1000000000", CARMY_RATE_LIMIT_KNOWN="1000000000")
    env.pop("RUST_LOG", None)
    env.pop("CARMY_IDEMPOTENCY_URL", None)
    if config:
        env["CARMY_CONFIG"] = config
    if receiver_port:
        env.update(CARMY_EVENTS_ALLOW_HTTP="true", CARMY_EVENTS_ALLOW_NETWORKS="127.0.0.0/8")
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *shlex.split(binary)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while True:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
                connection.request("GET", "/agent/health/live")
                connection.getresponse().read()
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError(f"{binary} did not start")
                time.sleep(0.2)
        if receiver_port:
            subscribe(connection, receiver_port)
        if any(MCP_SESSION in value for value in headers.values()):
            session = opened_mcp_session(PORT)
            headers = {name: value.replace(MCP_SESSION, session) for name, value in headers.items()}
        for number in range(requests):
            sent = body.replace("{id}", f"{os.getpid()}-{requests}-{number}") if body else None
            connection.request(method, path, body=sent, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status >= 400:
                raise RuntimeError(f"{binary}: {response.status}")
        connection.close()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=120)
    text = open(out).read()
    os.unlink(out)
    return int(re.search(r"^summary:\s+(\d+)", text, re.M).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--path", default="/agent/execute")
    parser.add_argument("--body", default='{"tool":"create_order","arguments":{"sku":"KB-01"}}')
    parser.add_argument("--header", action="append", default=[])
    parser.add_argument("--config", help="CARMY_CONFIG for every binary")
    parser.add_argument("--subscribe", action="store_true")
    parser.add_argument("--mcp-session", action="store_true")
    args = parser.parse_args()
    if args.mcp_session:
        args.path = "/mcp"
        args.body = mcp_session_call("create_order", {"sku": "KB-01"})
        args.header = SESSION_HEADERS.splitlines() + args.header
    receiver_port = None
    if args.subscribe:
        receiver = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        receiver_port = receiver.server_address[1]
    method = "POST" if args.body else "GET"
    headers = {"Content-Type": "application/json"} if args.body else {}
    for header in args.header:
        name, value = header.split(":", 1)
        headers[name.strip()] = value.strip()
    first = None
    for binary in args.binaries:
        small = count(binary, SMALL, method, args.path, args.body or None, headers, args.config,
                      receiver_port)
        large = count(binary, LARGE, method, args.path, args.body or None, headers, args.config,
                      receiver_port)
        per_request = (large - small) / (LARGE - SMALL)
        first = first or per_request
        print(f"{binary}: {per_request:,.0f} instructions per request ({per_request / first:.3f}× the first)")


if __name__ == "__main__":
    main()
