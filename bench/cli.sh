#!/usr/bin/env bash
# bq-dedupe run --store memory vs the Python peer doing the same job
# (bench/cli_peer.py), on the bench workload; median of RUNS (default 3) runs each,
# alternating, so a busy machine weighs on both alike. Measures, asserts nothing.
#
#   bench/cli.sh [WORKLOAD] [-- extra bq-dedupe run flags, e.g. --batch 1]
#
# Needs a release build of the host (cargo build --release -p babelqueue-dedupe-host,
# after scripts/build-component.sh) and babelqueue==1.24.0 for Python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORKLOAD="${1:-$ROOT/target/bench/workload.jsonl}"
shift || true
[[ "${1:-}" == "--" ]] && shift
RUNS="${RUNS:-3}"
BIN="${BQ_DEDUPE_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/bq-dedupe}"
[[ -f "$WORKLOAD" ]] || { echo "no workload $WORKLOAD: cargo run --release --example gen_workload -- $WORKLOAD" >&2; exit 1; }
[[ -x "$BIN" ]] || { echo "no $BIN: cargo build --release -p babelqueue-dedupe-host" >&2; exit 1; }
lines=$(wc -l <"$WORKLOAD")
secs() { local t0 t1; t0=$(date +%s.%N); "$@" <"$WORKLOAD" >/dev/null 2>/dev/null || true; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# One untimed run first: the first run of a new build compiles the component into
# wasmtime's cache (about 0.25 s); every later run, like a user's, loads it.
"$BIN" run --store memory "$@" </dev/null >/dev/null 2>&1 || true
cli=(); py=()
for _ in $(seq "$RUNS"); do
    cli+=("$(secs "$BIN" run --store memory "$@")")
    py+=("$(secs python3 "$ROOT/bench/cli_peer.py")")
done
c=$(printf '%s\n' "${cli[@]}" | median)
p=$(printf '%s\n' "${py[@]}" | median)
echo "lines: $lines; runs (s): bq-dedupe ${cli[*]}; python ${py[*]}"
awk -v n="$lines" -v c="$c" -v p="$p" 'BEGIN {
    printf "| path | lines/s | ns/line | vs Python |\n|---|---:|---:|---:|\n"
    printf "| `bq-dedupe run --store memory` | %.0f | %.0f | %.2fx |\n", n / c, c * 1e9 / n, p / c
    printf "| Python peer (`bench/cli_peer.py`) | %.0f | %.0f | 1.00x |\n", n / p, p * 1e9 / n
}'
