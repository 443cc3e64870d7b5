#!/usr/bin/env bash
# The shipped sizes side by side, from the builds already made (make bench builds
# them first): the component, the JS package's wasm, the example worker's bundle.
# Prints bytes, KiB and gzip -9; measures, asserts nothing (the budgets are checked
# by each build script).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
row() {
    local what=$1 file=$2 budget=$3
    if [[ ! -f "$file" ]]; then
        printf '| %s | (not built: %s) | | | %s |\n' "$what" "${file#"$ROOT"/}" "$budget"
        return
    fi
    local raw gz
    raw=$(wc -c <"$file")
    gz=$(gzip -9 -c "$file" | wc -c)
    printf '| %s | %d | %.1f | %d | %s |\n' "$what" "$raw" "$(awk -v b="$raw" 'BEGIN { print b / 1024 }')" "$gz" "$budget"
}
echo "| artifact | bytes | KiB | gzip -9 bytes | budget |"
echo "|---|---:|---:|---:|---|"
row "component (\`bq_dedupe.component.wasm\`)" "$TARGET/component/bq_dedupe.component.wasm" "256 KiB"
row "JS package wasm (\`crates/js/pkg/web\`)" "$ROOT/crates/js/pkg/web/bq_dedupe_bg.wasm" "180 KiB"
row "example worker (\`crates/worker-example/build\`)" "$ROOT/crates/worker-example/build/index_bg.wasm" "1 MiB gzip"
