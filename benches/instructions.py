#!/usr/bin/env python3
"""Server instructions per request, counted by callgrind: repeatable whatever else the machine
is doing, so two builds compare exactly even on a loaded machine (wall-clock req/s does not).

    python3 benches/instructions.py BIN [BIN ...] [--path /agent/execute] [--body JSON]
                                    [--header 'Name: value'] [--config carmy.toml]

Each binary (the example, `shop`, of some build) runs under `valgrind --tool=callgrind`; one
keep-alive client sends the same request SMALL times, then LARGE times in a second run; the
difference of the two totals divided by LARGE - SMALL is the cost of one request, start-up and
shutdown cancelled out. Loopback only.
"""

import argparse
import http.client
import os
import re
import signal
import subprocess
import tempfile
import time

PORT = 3190
SMALL, LARGE = 200, 1200


def count(binary, requests, method, path, body, headers, config):
    out = tempfile.NamedTemporaryFile(prefix="callgrind-", suffix=".out", delete=False).name
    env = dict(os.environ, CARMY_ADDR=f"127.0.0.1:{PORT}",
               CARMY_RATE_LIMIT_ANONYMOUS="1000000000", CARMY_RATE_LIMIT_KNOWN="1000000000")
    env.pop("RUST_LOG", None)
    env.pop("CARMY_IDEMPOTENCY_URL", None)
    if config:
        env["CARMY_CONFIG"] = config
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary],
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
        for _ in range(requests):
            connection.request(method, path, body=body, headers=headers)
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
    args = parser.parse_args()
    method = "POST" if args.body else "GET"
    headers = {"Content-Type": "application/json"} if args.body else {}
    for header in args.header:
        name, value = header.split(":", 1)
        headers[name.strip()] = value.strip()
    first = None
    for binary in args.binaries:
        small = count(binary, SMALL, method, args.path, args.body or None, headers, args.config)
        large = count(binary, LARGE, method, args.path, args.body or None, headers, args.config)
        per_request = (large - small) / (LARGE - SMALL)
        first = first or per_request
        print(f"{binary}: {per_request:,.0f} instructions per request ({per_request / first:.3f}× the first)")


if __name__ == "__main__":
    main()
