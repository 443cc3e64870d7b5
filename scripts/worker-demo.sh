#!/usr/bin/env bash
# The project's local demo on the fixture worker:
#   1. `wrangler dev` on 127.0.0.1:PORT, local state under STATE_DIR (fresh each run),
#      which builds the worker first (wrangler.toml's [build] command);
#   2. publishes examples/sample-stream.jsonl (duplicates, a malformed line, an
#      invalid envelope, an envelope without meta.id) through POST /publish, as-is,
#      plus an order whose handler fails once (retried by the queue);
#   3. publishes it again (a redelivery of everything);
#   4. prints GET /effects, GET /stats and GET /dead-letters, then stops the worker.
# BQ_DEMO_KEEP=1 leaves the worker running (the playground is at http://127.0.0.1:PORT/).
# Every route needs `Authorization: Bearer <token>`: a random token is made for the
# run (printed; the playground's worker store asks for it), and the example
# handler's test directives are switched on (EXAMPLE_TEST_DIRECTIVES=1, local only).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PORT="${1:-8787}"
STATE="${2:-.wrangler-state}"
SAMPLE="examples/sample-stream.jsonl"
BASE="http://127.0.0.1:$PORT"

scripts/build-worker.sh # also installs the npm tools wrangler needs
if curl -s -o /dev/null "$BASE/"; then
    echo "something already answers on $BASE: stop it, or pass another port" >&2
    exit 1
fi
rm -rf "$STATE"
mkdir -p "$STATE"
export WRANGLER_SEND_METRICS=false
TOKEN="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
# The token never goes on a command line (`ps` would show it): wrangler reads it
# from an env file and curl its header from a file, both readable by us only.
(
    umask 077
    printf 'EXAMPLE_ADMIN_TOKEN=%s\n' "$TOKEN" >"$STATE/demo.env"
    printf 'Authorization: Bearer %s\n' "$TOKEN" >"$STATE/auth.header"
)
AUTH="@$STATE/auth.header"
# Its own process group (npx -> wrangler -> workerd), so stopping it stops them all.
setsid npx wrangler dev --ip 127.0.0.1 --port "$PORT" --inspector-port 0 \
    --persist-to "$STATE" --show-interactive-dev-session=false \
    --env-file "$STATE/demo.env" --var EXAMPLE_TEST_DIRECTIVES:1 \
    >"$STATE/wrangler.log" 2>&1 &
WRANGLER=$!
stop() {
    [[ "${BQ_DEMO_KEEP:-}" == 1 ]] && return
    kill -TERM -- "-$WRANGLER" 2>/dev/null || return 0
    for _ in $(seq 50); do
        kill -0 -- "-$WRANGLER" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-$WRANGLER" 2>/dev/null || true
}
trap stop EXIT

for _ in $(seq 300); do
    curl -sf -H "$AUTH" "$BASE/stats" >/dev/null 2>&1 && break
    kill -0 "$WRANGLER" 2>/dev/null || { cat "$STATE/wrangler.log"; exit 1; }
    sleep 0.2
done
curl -sf -H "$AUTH" "$BASE/stats" >/dev/null || { cat "$STATE/wrangler.log"; exit 1; }
echo "== wrangler dev: $BASE (state in $STATE/; admin token for this run: $TOKEN)"

# Every line as a raw string, so malformed ones are published exactly as written,
# plus one order whose handler fails its first attempt (the fixture handler obeys
# `data.fail_attempts`), to show Cloudflare's retry running it again.
FLAKY='{"job":"urn:babel:orders:created","trace_id":"7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b","data":{"order_id":1007,"fail_attempts":1},"meta":{"id":"00000007-b5a6-4789-90ab-cdef01234567","queue":"orders","lang":"python","schema_version":1,"created_at":1749132727000},"attempts":0}'
payload=$(python3 -c 'import json,sys; print(json.dumps([l.rstrip("\n") for l in open(sys.argv[1]) if l.strip()] + [json.loads(sys.argv[2])]))' "$SAMPLE" "$FLAKY")
lines=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$payload")

wait_for() { # wait_for N: until N deliveries (and their dead letters) are done
    for _ in $(seq 300); do
        python3 - "$1" "$(curl -sf -H "$AUTH" "$BASE/stats")" <<'PY' && return 0
import json, sys
want, stats = int(sys.argv[1]), json.loads(sys.argv[2])
sys.exit(0 if stats["deliveries"] >= want and stats["dead_letters_received"] >= stats["dead_lettered"] else 1)
PY
        sleep 0.2
    done
    echo "timed out waiting for $1 deliveries" >&2
    return 1
}

echo "== publish $SAMPLE + one flaky order ($lines messages, with duplicates)"
curl -sf -H "$AUTH" -X POST "$BASE/publish" -H 'content-type: application/json' -d "$payload"; echo
wait_for $((lines + 1)) # + the flaky order's retry
echo "== publish it all again (every message redelivered)"
curl -sf -H "$AUTH" -X POST "$BASE/publish" -H 'content-type: application/json' -d "$payload"; echo
wait_for $((2 * lines + 1))

pretty() { python3 -m json.tool; }
echo "== GET /effects (side effects per meta.id; total includes fail-open runs)"
curl -sf -H "$AUTH" "$BASE/effects" | pretty
echo "== GET /stats"
curl -sf -H "$AUTH" "$BASE/stats" | pretty
echo "== GET /dead-letters (poison, wrapped with a dead_letter block)"
curl -sf -H "$AUTH" "$BASE/dead-letters" | python3 -c 'import json,sys; [print(json.dumps(d)[:160]) for d in json.load(sys.stdin)["dead_letters"]]'
if [[ "${BQ_DEMO_KEEP:-}" == 1 ]]; then
    echo "== still running: $BASE/ (playground; its worker store asks for the token $TOKEN), stop with: kill -- -$WRANGLER"
fi
