#!/usr/bin/env python3
"""Execute with a webhook subscription to `execution.finished` against the same example
without one, interleaved in one run (BENCHMARKS.md, "Events on and off").

    python3 benches/events.py [--rounds 5] [--seconds 3]

Both servers are the example as shipped (release build in $CARGO_TARGET_DIR, events on),
pinned to CPU 0, wrk on CPU 1; every call carries a fresh `request_id`, so every call writes
an event when subscribed. The subscribed one delivers to a receiver on 127.0.0.1 (a thread of
this script answering 204); loopback is allowed for it with CARMY_EVENTS_ALLOW_HTTP and
CARMY_EVENTS_ALLOW_NETWORKS, as a test configuration would.
"""

import argparse
import http.server
import json
import statistics
import threading
import urllib.request

import run

BODY = run.CREATE_FRESH
HEADERS = run.JSON_HEADERS
INTERNAL = "Bearer shop-internal-demo-token"


class Receiver(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    deliveries = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Receiver.deliveries += 1
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # a server stopped mid-delivery resets its connection: expected here


def subscribe(receiver_port):
    body = json.dumps({"url": f"http://127.0.0.1:{receiver_port}/hook",
                       "event_types": ["execution.finished"]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{run.PORT}/agent/events/subscriptions", data=body,
        headers={"Content-Type": "application/json", "Authorization": INTERNAL})
    with urllib.request.urlopen(request) as response:
        assert response.status == 201, response.status


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=3)
    args = parser.parse_args()
    receiver = QuietServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    run.os.environ.update(CARMY_EVENTS_ALLOW_HTTP="true", CARMY_EVENTS_ALLOW_NETWORKS="127.0.0.0/8")
    results = {"without a subscription": [], "subscribed to execution.finished": []}
    for round_number in range(1, args.rounds + 1):
        for name in results:
            server = run.Server("carmy")
            try:
                if name.startswith("subscribed"):
                    subscribe(receiver.server_address[1])
                run.wrk("POST", "/agent/execute", BODY, HEADERS, 1)  # warm-up
                measured = run.wrk("POST", "/agent/execute", BODY, HEADERS, args.seconds)
                measured["rss"] = server.peak_rss_mib()
            finally:
                server.stop()
            results[name].append(measured)
            print(f"round {round_number} {name:34} {measured['rps']:8.0f} req/s "
                  f"p50 {measured['p50']:.2f} ms p99 {measured['p99']:.2f} ms non-2xx {measured['non2xx']}")
    base = statistics.median(r["rps"] for r in results["without a subscription"])
    print("\n| server | req/s | ×without | p50 ms | p99 ms | peak RSS MiB | non-2xx |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, rounds in results.items():
        rps = statistics.median(r["rps"] for r in rounds)
        print(f"| {name} | {rps:,.0f} | {rps / base:.2f} | "
              f"{statistics.median(r['p50'] for r in rounds):.2f} | "
              f"{statistics.median(r['p99'] for r in rounds):.2f} | "
              f"{statistics.median(r['rss'] for r in rounds):.1f} | "
              f"{sum(r['non2xx'] for r in rounds)} |")
    print(f"\nper-round ratios: {[round(s['rps'] / w['rps'], 2) for w, s in zip(*results.values())]}")
    print(f"deliveries received: {Receiver.deliveries}")


if __name__ == "__main__":
    main()
