#!/usr/bin/env python3
"""The durable stores against their engine's own limit, in the same run:

    python3 benches/engines.py [--rounds 3] [--seconds 5] [--clients 32] [--only postgres|redis]

For each engine, interleaved for --rounds rounds:
- the engine alone, running the store's own statements for one call with a fresh request_id:
  PostgreSQL with `pgbench -M prepared` running the RESERVE and the FINISH statements read from
  carmy/src/store/postgres/keys.rs (parameters made literals, each autocommitted, as carmy
  sends them); Redis
  with `redis-benchmark` running `EVALSHA` of the RESERVE and FINISH scripts read from
  carmy/src/store/redis/scripts.rs (a pass of each, fresh keys, then finishing those keys; one
  call is one of each, so its rate is 1 / (1/reserve + 1/finish));
- the example (release build, pinned to CPU 0, its default logging to a file) on that store,
  `wrk` on CPU 1 with the same number of connections, `create_order` with a fresh request_id.

It prints each round and a table of medians: calls per second, and carmy over the engine.
Loopback only: this machine's PostgreSQL (127.0.0.1:5432, database test) and Redis (6379).
"""

import argparse
import csv
import hashlib
import io
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
LUA = ROOT / "benches" / "wrk" / "request.lua"
PORT = 3150
POSTGRES = "postgres://postgres@127.0.0.1:5432/test"
REDIS = "redis://127.0.0.1:6379"
BODY = '{"tool":"create_order","arguments":{"sku":"KB-01"},"request_id":"{id}"}'


def run(command, **kwargs):
    print("$", " ".join(command), file=sys.stderr)
    return subprocess.run(command, check=True, capture_output=True, text=True, **kwargs).stdout


def postgres_statement(name):
    """A statement of the PostgreSQL store, as its source holds it: `const NAME: &str = "\\…";`."""
    source = (ROOT / "carmy/src/store/postgres/keys.rs").read_text()
    return re.search(rf'const {name}: &str = "\\\n(.*?)";', source, re.S).group(1)


def postgres_call_script():
    """The store's own statements for one call with a fresh request_id, as carmy sends them
    (RESERVE, then FINISH, each autocommitted): a pgbench script, its parameters made literals."""
    request_id = "'pgbench-' || :client_id || '-' || :n"
    common = {"$1": "'peer:127.0.0.1'", "$2": request_id}
    execution_id = "'exec_01a23190-0000-7000-8000-000000000000'"
    reserve = {**common, "$3": "'create_order'", "$5": execution_id, "$6": "30500", "$7": "86400000",
               "$4": "'\\x8f2b1c7e0a9d4e6b3f5a2c1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f'::bytea"}
    finish = {**common, "$3": execution_id, "$4": "'finished'", "$5": "'completed'", "$6": "NULL",
              "$7": "NULL", "$8": "'\\x7b22657865637574696f6e5f6964223a2265786563227d'::bytea",
              "$9": "86400000"}
    statements = []
    for name, values in (("RESERVE", reserve), ("FINISH", finish)):
        statement = postgres_statement(name)
        for parameter in sorted(values, reverse=True):
            statement = statement.replace(parameter, values[parameter])
        statements.append(statement + ";")
    return "\\set n random(1, 2000000000)\n" + "\n".join(statements) + "\n"


def pgbench(seconds, clients):
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(postgres_call_script())
        script.flush()
        output = run(["pgbench", "-n", "-M", "prepared", "-c", str(clients), "-j", "1", "-T", str(seconds),
                      "-f", script.name, "-h", "127.0.0.1", "-U", "postgres", "test"])
    return float(re.search(r"tps = ([\d.]+)", output).group(1))


def redis_script(name):
    """A script of the Redis store, as its source holds it: `const NAME: &str = r"…";`."""
    source = (ROOT / "carmy/src/store/redis/scripts.rs").read_text()
    return re.search(rf'const {name}: &str = r"(.*?)";', source, re.S).group(1)


def redis_rate(seconds, clients):
    reserve, finish = redis_script("RESERVE"), redis_script("FINISH")
    for script in (reserve, finish):
        run(["redis-cli", "-h", "127.0.0.1", "script", "load", script])
    sha = lambda script: hashlib.sha1(script.encode()).hexdigest()
    requests = str(int(20000 * seconds))
    prefix = f"bench:{os.getpid()}:{time.time_ns()}:__rand_int__"
    execution = "exec_01a23190-0000-7000-8000-000000000000"
    common = ["redis-benchmark", "-h", "127.0.0.1", "-c", str(clients), "-n", requests, "-r", requests, "--csv"]
    rates = []
    for command in (
        ["EVALSHA", sha(reserve), "1", prefix, execution, "create_order", "d" * 32, "30500", "86400000"],
        # a body of the size of create_order's answer, without the commas and quotes that
        # redis-benchmark's CSV would not escape
        ["EVALSHA", sha(finish), "1", prefix, execution, "finished", "86400000", "completed", "", "",
         "b" * 150],
    ):
        output = run(common + command)
        rates.append(float(list(csv.DictReader(io.StringIO(output)))[-1]["rps"]))
    run(["redis-cli", "-h", "127.0.0.1", "eval",
         "for _, k in ipairs(redis.call('KEYS', ARGV[1])) do redis.call('DEL', k) end", "0",
         f"bench:{os.getpid()}:*"])
    return 1 / sum(1 / rate for rate in rates)


def carmy(store, seconds, clients):
    env = dict(os.environ, CARMY_ADDR=f"127.0.0.1:{PORT}", CARMY_IDEMPOTENCY_URL=store,
               CARMY_RATE_LIMIT_ANONYMOUS="1000000000", CARMY_CONFIG=str(ROOT / "examples/shop/carmy.toml"))
    env.pop("RUST_LOG", None)
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(["taskset", "-c", "0", str(TARGET / "release" / "shop")], env=env,
                                  stdout=subprocess.DEVNULL, stderr=log)
        try:
            deadline = time.time() + 20
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{PORT}/agent/health/live", timeout=1)
                    break
                except Exception:
                    if time.time() > deadline:
                        raise RuntimeError("the example did not start")
                    time.sleep(0.05)
            wrk_env = dict(os.environ, BENCH_METHOD="POST", BENCH_PATH="/agent/execute",
                           BENCH_HEADERS="Content-Type: application/json",
                           # unique to this run too: the records of earlier runs are still kept
                           BENCH_BODY=BODY.replace("{id}", f"{time.time_ns()}-{{id}}"))
            command = ["taskset", "-c", "1", "wrk", "-t1", f"-c{clients}", f"-d{seconds}s", "-s", str(LUA),
                       f"http://127.0.0.1:{PORT}/agent/execute"]
            run(command[:5] + ["-d1s"] + command[6:], env=wrk_env)  # warm-up
            output = run(command, env=wrk_env)
        finally:
            server.kill()
            server.wait()
    non2xx = int(re.search(r"non2xx: (\d+)", output).group(1))
    if non2xx:
        raise RuntimeError(f"{non2xx} calls were not answered 2xx")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--only", choices=["postgres", "redis"])
    args = parser.parse_args()
    engines = {
        "postgres": (lambda: pgbench(args.seconds, args.clients), POSTGRES, "pgbench, the store's statements"),
        "redis": (lambda: redis_rate(args.seconds, args.clients), REDIS, "redis-benchmark, EVALSHA of the scripts"),
    }
    if args.only:
        engines = {args.only: engines[args.only]}
    results = {name: {"engine": [], "carmy": []} for name in engines}
    for round_index in range(args.rounds):
        for name, (engine, url, _) in engines.items():
            limit = engine()
            served = carmy(url, args.seconds, args.clients)
            results[name]["engine"].append(limit)
            results[name]["carmy"].append(served)
            print(f"round {round_index + 1} {name}: engine {limit:,.0f}/s, carmy {served:,.0f}/s "
                  f"({served / limit:.2f}×)", file=sys.stderr)
    print(f"| store | engine alone | calls/s | carmy calls/s | carmy ÷ engine |")
    print("|---|---|---:|---:|---:|")
    for name, (_, _, label) in engines.items():
        runs = results[name]
        ratio = statistics.median(c / e for c, e in zip(runs["carmy"], runs["engine"]))
        print(f"| {name} | {label} | {statistics.median(runs['engine']):,.0f} | "
              f"{statistics.median(runs['carmy']):,.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
