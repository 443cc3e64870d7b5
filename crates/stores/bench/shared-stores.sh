#!/usr/bin/env bash
# Deliveries per second through `bq-dedupe run --batch 100` on every shared
# store, and store round trips per batch. Measures, never asserts. Run it under
# the servers the stores' table names, from the repository root:
#
#   scripts/with-stores.sh crates/stores/bench/shared-stores.sh [N]
#
# BQ (default target/release/bq-dedupe, else target/debug/bq-dedupe) is the
# binary measured. Round trips: PostgreSQL's are counted by the server
# (pg_stat_statements calls on the benchmark's tables: every statement of this
# store is sent with its parameters in one message burst, so one statement is
# one round trip); Redis' are server write events (INFO stats
# total_writes_processed: one per reply burst, so at least one per pipeline;
# a request larger than Redis' 16 KiB read buffer is answered in several bursts,
# so this over-counts large pipelines).
set -euo pipefail

N=${1:-20000}
BQ=${BQ:-}
if [[ -z $BQ ]]; then
  if [[ -x target/release/bq-dedupe ]]; then BQ=target/release/bq-dedupe; else BQ=target/debug/bq-dedupe; fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$N" "$work/stream.jsonl" <<'PY'
import json, sys, uuid
n, path = int(sys.argv[1]), sys.argv[2]
run = uuid.uuid4().hex[:8]
with open(path, "w") as f:
    for i in range(n):
        f.write(json.dumps({"job": "urn:babel:orders:created", "trace_id": "7b3f9c2a-e41d-4f88-9b2a-1c0d5e6f7a8b",
            "data": {"order_id": i}, "attempts": 0,
            "meta": {"id": f"{run}-{i:08d}", "queue": "orders", "schema_version": 1}}) + "\n")
PY
batches=$(( (N + 99) / 100 ))

pg_calls() { # statements naming a bench table (DDL included: a few per run)
  psql "$BQ_TEST_POSTGRES_URL" -qtA -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
    -c "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '%bench\_%' AND query NOT LIKE '%pg_stat_statements%'" | tail -n 1
}
redis_writes() { # every node of a spec's servers, summed
  local total=0 n
  for port in "$@"; do
    n=$(redis-cli -p "$port" INFO stats | tr -d '\r' | awk -F: '/^total_writes_processed/ {print $2}')
    total=$((total + n))
  done
  echo "$total"
}
port_of() { local u=${1#*://}; u=${u%%/*}; echo "${u##*:}"; }

# counter: a command printing a running count (pg_xacts or redis_writes PORTS...)
measure() { # name spec mode counter...
  local name=$1 spec=$2 mode=$3; shift 3
  local args=(run --store "$spec" --batch 100)
  [[ $mode == claim ]] && args+=(--claim)
  for pass in first again; do
    sleep 0.2 # pg_stat_statements counts a statement when it ends
    local before after rate
    before=$("$@")
    # A run that parks or fails some deliveries exits non-zero: still measured,
    # and its summary line says what happened.
    "$BQ" "${args[@]}" "$work/stream.jsonl" >/dev/null 2>"$work/err" || true
    rate=$(sed -n 's/^summary: .*(\([0-9]*\)\/s).*/\1/p' "$work/err")
    grep -q '"run":\|"skip":' "$work/err" || { echo "$name $mode $pass:"; cat "$work/err"; } >&2
    after=$("$@")
    printf '| %s | %s | %s | %s | %.1f |\n' "$name" "$mode" "$pass" "$rate" \
      "$(python3 -c "print(($after - $before - ${ADJUST:-0}) / $batches)")"
  done
}

echo "N=$N deliveries, batches of 100, binary $BQ"
echo
echo "| store | mode | pass | deliveries/s | round trips per batch |"
echo "|---|---|---|---|---|"
rp=$(port_of "$BQ_TEST_REDIS_URL")
IFS=, read -r -a cports <<<"${BQ_TEST_REDIS_CLUSTER_URL#redis+cluster://}"
cports=("${cports[@]##*:}")
tag=$RANDOM
sep() { [[ $1 == *\?* ]] && echo '&' || echo '?'; }
for mode in plain claim; do
  measure "redis (native)" "$BQ_TEST_REDIS_URL$(sep "$BQ_TEST_REDIS_URL")prefix=bench$tag$mode:" "$mode" redis_writes "$rp"
  measure "redis (php)" "$BQ_TEST_REDIS_URL$(sep "$BQ_TEST_REDIS_URL")dialect=php&prefix=benchphp$tag$mode:" "$mode" redis_writes "$rp"
  [[ $mode == plain ]] && measure "redis (go)" "$BQ_TEST_REDIS_URL$(sep "$BQ_TEST_REDIS_URL")dialect=go&prefix=benchgo$tag:" "$mode" redis_writes "$rp"
  measure "redis cluster (3 nodes)" "$BQ_TEST_REDIS_CLUSTER_URL?prefix=bench$tag$mode:" "$mode" redis_writes "${cports[@]}"
  measure "postgresql" "$BQ_TEST_POSTGRES_URL$(sep "$BQ_TEST_POSTGRES_URL")table=bench_${tag}_$mode" "$mode" pg_calls
done
