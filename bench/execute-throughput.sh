#!/usr/bin/env bash
# Execute throughput with a fresh request_id per call, on each idempotency store, in one run:
# the release-mode shop on 127.0.0.1, loaded by wrk over loopback.
#   bash bench/execute-throughput.sh [seconds] [connections]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-10}"
connections="${2:-32}"
port=3917
store_file="$(mktemp -d)/idempotency.redb"
cargo build --release -q -p shop
shop="${CARGO_TARGET_DIR:-target}/release/shop"

for url in "" "file:$store_file" "postgres://postgres@127.0.0.1:5432/test" "redis://127.0.0.1:6379"; do
  if [ -n "$url" ]; then
    CARMY_IDEMPOTENCY_URL="$url" CARMY_ADDR="127.0.0.1:$port" RUST_LOG=warn "$shop" &
  else
    env -u CARMY_IDEMPOTENCY_URL CARMY_ADDR="127.0.0.1:$port" RUST_LOG=warn "$shop" &
  fi
  pid=$!
  for _ in $(seq 1 50); do
    curl -sf "http://127.0.0.1:$port/agent/tools" >/dev/null 2>&1 && break
    sleep 0.1
  done
  rps=$(wrk -t2 -c"$connections" -d"${seconds}s" -s bench/execute_with_request_id.lua \
    "http://127.0.0.1:$port" -- "$(date +%s%N)" | awk '/Requests\/sec/ {print $2} /Non-2xx/ {print "ERRORS:" $0}')
  name="${url%%:*}"
  printf '%-10s %s req/s\n' "${name:-memory}" "$rps"
  kill "$pid"
  wait "$pid" 2>/dev/null || true
done
