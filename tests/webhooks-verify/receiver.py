"""A webhook receiver that verifies every delivery with the official Standard Webhooks library.

Driven by tests/integration/webhook_durability.rs over stdin and stdout:

- prints `listening http://127.0.0.1:PORT/hook` once it accepts deliveries;
- stdin `secrets whsec_A [whsec_B]`: every later delivery must verify with each of them on its
  own (after a rotation both keys sign, so both must); answers `secrets N`;
- each delivery: `verified WEBHOOK-ID TYPE N` and a 204, or `bad WEBHOOK-ID REASON`, a 400 and
  exit status 1 at once;
- stdin closed: `done N` (deliveries verified) and exit status 0.

Gives up by itself after 60 s, so a stuck test never leaves it behind.
"""

import http.server
import os
import sys
import threading

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

lock = threading.Lock()
secrets: list[str] = []
verified = 0


def say(line: str) -> None:
    with lock:
        print(line, flush=True)


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        global verified
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        headers = {name: value for name, value in self.headers.items()}
        webhook_id = headers.get("webhook-id", headers.get("Webhook-Id", "-"))
        with lock:
            keys = list(secrets)
        try:
            if not keys:
                raise WebhookVerificationError("a delivery before any secret was given")
            for key in keys:
                event = Webhook(key).verify(body, headers)
        except (WebhookVerificationError, ValueError) as error:
            say(f"bad {webhook_id} {error}")
            self.send_response(400)
            self.end_headers()
            self.wfile.flush()
            os._exit(1)
        with lock:
            verified += 1
        say(f"verified {webhook_id} {event['type']} {len(keys)}")
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def read_commands() -> None:
    for line in sys.stdin:
        words = line.split()
        if words and words[0] == "secrets":
            with lock:
                secrets[:] = words[1:]
            say(f"secrets {len(words) - 1}")
    say(f"done {verified}")
    os._exit(0)


def main() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    host, port = server.server_address[:2]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Timer(60, lambda: (say("timed out"), os._exit(2))).start()
    say(f"listening http://{host}:{port}/hook")
    read_commands()


if __name__ == "__main__":
    main()
