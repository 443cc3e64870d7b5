#!/usr/bin/env bash
# The project's local demo on the example worker:
#   1. `wrangler dev` on 127.0.0.1:PORT, local state under STATE_DIR (fresh each run),
#      which builds the worker first (wrangler.toml's [build] command);
#   2. publishes examples/sample-stream.jsonl (duplicates, a malformed line, an
#      invalid envelope, an envelope without meta.id) through POST /publish, as-is;
#   3. publishes it again (a redelivery of everything);
#   4. prints GET /effects, GET /stats and GET /dead-letters, then stops the worker.
# BQ_DEMO_KEEP=1 leaves the worker running (the playground is at http://127.0.0.1:PORT/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PORT="${1:-8787}"
STATE="${2:-.wrangler-state}"
SAMPLE="examples/sample-stream.jsonl"
BASE="http://127.0.0.1:$PORT"

scripts/build-worker.sh # also installs the npm tools wrangler needs
rm -rf "$STATE"
mkdir -p "$STATE"
export WRANGLER_SEND_METRICS=false
npx wrangler dev --ip 127.0.0.1 --port "$PORT" --inspector-port 0 \
    --persist-to "$STATE" --show-interactive-dev-session=false \
    >"$STATE/wrangler.log" 2>&1 &
WRANGLER=$!
stop() { [[ "${BQ_DEMO_KEEP:-}" == 1 ]] || kill "$WRANGLER" 2>/dev/null || true; }
trap stop EXIT

for _ in $(seq 300); do
    curl -sf "$BASE/stats" >/dev/null 2>&1 && break
    kill -0 "$WRANGLER" 2>/dev/null || { cat "$STATE/wrangler.log"; exit 1; }
    sleep 0.2
done
curl -sf "$BASE/stats" >/dev/null || { cat "$STATE/wrangler.log"; exit 1; }
echo "== wrangler dev: $BASE (state in $STATE/)"

# Every line as a raw string, so malformed ones are published exactly as written.
payload=$(python3 -c 'import json,sys; print(json.dumps([l.rstrip("\n") for l in open(sys.argv[1]) if l.strip()]))' "$SAMPLE")
lines=$(python3 -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$payload")

wait_for() { # wait_for N: until N deliveries (and their dead letters) are done
    for _ in $(seq 300); do
        python3 - "$1" "$(curl -sf "$BASE/stats")" <<'PY' && return 0
import json, sys
want, stats = int(sys.argv[1]), json.loads(sys.argv[2])
sys.exit(0 if stats["deliveries"] >= want and stats["dead_letters_received"] >= stats["dead_lettered"] else 1)
PY
        sleep 0.2
    done
    echo "timed out waiting for $1 deliveries" >&2
    return 1
}

echo "== publish $SAMPLE ($lines messages, with duplicates)"
curl -sf -X POST "$BASE/publish" -H 'content-type: application/json' -d "$payload"; echo
wait_for "$lines"
echo "== publish it again (every message redelivered)"
curl -sf -X POST "$BASE/publish" -H 'content-type: application/json' -d "$payload"; echo
wait_for $((2 * lines))

pretty() { python3 -m json.tool; }
echo "== GET /effects (side effects per meta.id; total includes fail-open runs)"
curl -sf "$BASE/effects" | pretty
echo "== GET /stats"
curl -sf "$BASE/stats" | pretty
echo "== GET /dead-letters (poison, wrapped with a dead_letter block)"
curl -sf "$BASE/dead-letters" | python3 -c 'import json,sys; [print(json.dumps(d)[:160]) for d in json.load(sys.stdin)["dead_letters"]]'
if [[ "${BQ_DEMO_KEEP:-}" == 1 ]]; then
    echo "== still running: $BASE/ (playground), stop with: kill $WRANGLER"
fi
