#!/usr/bin/env bash
# Runs a command with the fixture worker served on workerd (Miniflare, from the
# bundle scripts/build-worker.sh made) on a free loopback port, and stops it
# after. The command sees BQ_TEST_WORKER_URL.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir=$(mktemp -d)
mkfifo "$dir/stdin"
# The server stops when its stdin closes: when this script exits, however.
node "$ROOT/crates/workers/tests/serve.mjs" <"$dir/stdin" >"$dir/out" 2>"$dir/err" &
pid=$!
exec 3>"$dir/stdin"
stop() {
  exec 3>&-
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT
for _ in $(seq 300); do
  grep -q '^BQ_TEST_WORKER_URL=' "$dir/out" 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$dir/err" >&2; echo "with-worker: the worker did not start" >&2; exit 1; }
  sleep 0.1
done
line=$(grep '^BQ_TEST_WORKER_URL=' "$dir/out") || { cat "$dir/err" >&2; echo "with-worker: no URL after 30 s" >&2; exit 1; }
export "${line?}"
echo "with-worker: the fixture worker on $BQ_TEST_WORKER_URL"
"$@"
