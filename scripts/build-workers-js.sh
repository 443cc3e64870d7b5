#!/usr/bin/env bash
# Builds @babelqueue/dedupe/workers (crates/workers-js): the package's module for
# Cloudflare Workers, with the Rust DedupeShard and Queues consumer beside the
# package's API, into crates/js/workers/:
#
#   scripts/build-workers-js.sh    # -> crates/js/workers/{workers.js, workers.d.ts, bq_dedupe_workers*}
#
# cargo build (wasm32: scripts/js-wasm-build.sh), wasm-bindgen --target web (the
# pinned CLI), wasm-opt (npm binaryen), then the glue (crates/workers-js/js/) that
# instantiates the module wrangler's bundler imports; the cargo profile, wasm-opt
# flags and budget (a gzip'd worker of 1 MiB, Cloudflare's free plan) are row
# `workers-js` of mk/artifacts.tsv. Prints the sizes, and fails over the budget
# (BQ_WORKER_BUDGET overrides it for a run).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/crates/workers-js"
OUT="$ROOT/crates/js/workers"
NAME=bq_dedupe_workers
. "$ROOT/scripts/artifact.sh" workers-js
BUDGET="${BQ_WORKER_BUDGET:-$ARTIFACT_BUDGET}"

WB="$("$ROOT/scripts/ensure-tools.sh" wasm-bindgen)"
"$ROOT/scripts/ensure-tools.sh" npm "$ROOT" >/dev/null # binaryen (the root package.json)
WASM_OPT="$ROOT/node_modules/.bin/wasm-opt"

RAW="$("$ROOT/scripts/js-wasm-build.sh" workers-js babelqueue-dedupe-workers-js)"

STAMP="$OUT/.built"
if [[ ! -f "$STAMP" || "$RAW" -nt "$STAMP" || "${BASH_SOURCE[0]}" -nt "$STAMP" || "$SRC/js/workers.js" -nt "$STAMP" || "$SRC/js/workers.d.ts" -nt "$STAMP" || "$ARTIFACTS_TSV" -nt "$STAMP" ]]; then
    rm -rf "$OUT"
    mkdir -p "$OUT"
    "$WB" --target web --out-dir "$OUT" --out-name "$NAME" "$RAW"
    mv "$OUT/${NAME}_bg.wasm" "$OUT/bindgen.wasm"
    "$WASM_OPT" "${ARTIFACT_WASM_OPT[@]}" --strip-debug --strip-producers \
        --enable-reference-types --enable-bulk-memory --enable-nontrapping-float-to-int \
        --enable-sign-ext --enable-mutable-globals --enable-multivalue \
        "$OUT/bindgen.wasm" -o "$OUT/${NAME}_bg.wasm"
    rm "$OUT/bindgen.wasm"
    cp "$SRC/js/workers.js" "$SRC/js/workers.d.ts" "$OUT/"
    touch "$STAMP"
fi
wasm="$OUT/${NAME}_bg.wasm"
raw=$(stat -c %s "$wasm")
gz=$(gzip -9 -n -c "$wasm" | wc -c)
printf 'workers module: %d B after wasm-opt (%.1f KiB), gzip -9 %d B (%.1f KiB; budget %d B %s)\n' \
    "$raw" "$(echo "$raw / 1024" | bc -l)" "$gz" "$(echo "$gz / 1024" | bc -l)" "$BUDGET" "$ARTIFACT_OF"
if (($(artifact_size "$wasm") > BUDGET)); then
    echo "the workers module is over budget" >&2
    exit 1
fi
