#!/usr/bin/env python3
"""Start-up of the example as shipped: from exec to its first `200` on `/agent/health/live`, and
its resident memory a second later, idle.

    python3 benches/startup.py BIN [BIN ...] [--runs N]

Each binary (a build of the example, `shop`) runs N times (15 unless told), pinned to CPU 0,
with the example's `carmy.toml` (CARMY_CONFIG); the medians are printed: start-up, `VmRSS`,
and its anonymous and file-backed parts. Loopback only.
"""

import argparse
import http.client
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

CONFIG = Path(__file__).resolve().parent.parent / "examples" / "shop" / "carmy.toml"
PORT = int(os.environ.get("BENCH_PORT", "3400"))


def answers(port):
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        connection.request("GET", "/agent/health/live")
        response = connection.getresponse()
        response.read()
        return response.status == 200
    except OSError:
        return False


def start_once(binary, port):
    env = dict(os.environ, CARMY_ADDR=f"127.0.0.1:{port}", CARMY_CONFIG=str(CONFIG))
    env.pop("RUST_LOG", None)
    started = time.perf_counter()
    server = subprocess.Popen(["taskset", "-c", "0", binary], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = started + 10
        while not answers(port):
            if time.perf_counter() > deadline or server.poll() is not None:
                raise RuntimeError(f"{binary} did not answer on port {port}")
            time.sleep(0.0005)
        elapsed_ms = (time.perf_counter() - started) * 1000
        time.sleep(1)
        status = Path(f"/proc/{server.pid}/status").read_text()
        memory = {field: int(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) / 1024
                  for field in ("VmRSS", "RssAnon", "RssFile")}
        return elapsed_ms, memory
    finally:
        server.kill()
        server.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binaries", nargs="+")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    for binary in args.binaries:
        runs = [start_once(binary, PORT + run) for run in range(args.runs)]
        median = lambda values: statistics.median(values)
        print(f"{binary}: start-up {median(ms for ms, _ in runs):.1f} ms "
              f"(fastest {min(ms for ms, _ in runs):.1f}); idle VmRSS "
              f"{median(m['VmRSS'] for _, m in runs):.1f} MiB, anon "
              f"{median(m['RssAnon'] for _, m in runs):.1f}, file "
              f"{median(m['RssFile'] for _, m in runs):.1f}")


if __name__ == "__main__":
    main()
