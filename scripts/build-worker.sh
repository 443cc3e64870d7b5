#!/usr/bin/env bash
# Builds the fixture worker (crates/fixture-worker) with worker-build, offline:
# the pinned wasm-bindgen CLI, esbuild and wasm-opt (npm binaryen) are handed to
# it, so it downloads nothing. Output: crates/fixture-worker/build/ (index.js +
# the .wasm), which wrangler.toml's `main` points at; then the playground's wasm
# build into www/pkg (scripts/build-js.sh), which it serves at /.
#
#   scripts/build-worker.sh          # prints the bundle size, fails over its budget
#
# The cargo profile, wasm-opt flags and budget are row `worker` of mk/artifacts.tsv
# (BQ_WORKER_BUDGET overrides the budget for a run).
# This is wrangler.toml's [build] command, so `npx wrangler dev` runs it too.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
. scripts/artifact.sh worker
BUDGET="${BQ_WORKER_BUDGET:-$ARTIFACT_BUDGET}"

# Tools: skip whatever is present at the pinned version.
export WASM_BINDGEN_BIN="$(scripts/ensure-tools.sh wasm-bindgen)"
WORKER_BUILD="$(scripts/ensure-tools.sh worker-build)"
scripts/ensure-tools.sh npm "$ROOT" >/dev/null # wrangler, miniflare, esbuild, binaryen
case "$(uname -m)" in
x86_64) esbuild_pkg=linux-x64 ;;
aarch64 | arm64) esbuild_pkg=linux-arm64 ;;
*) esbuild_pkg="linux-$(uname -m)" ;;
esac
export ESBUILD_BIN="$ROOT/node_modules/@esbuild/$esbuild_pkg/bin/esbuild"
export WASM_OPT_BIN="$ROOT/node_modules/.bin/wasm-opt"

# worker-build runs wasm-opt itself, with the flags of the crate's
# [package.metadata.wasm-pack.profile.custom]: they must be the table's.
manifest_opt="$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
p = next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "babelqueue-dedupe-fixture-worker")
print(" ".join(p["metadata"]["wasm-pack"]["profile"]["custom"]["wasm-opt"]))')"
if [[ "$manifest_opt" != "${ARTIFACT_WASM_OPT[*]}" ]]; then
    echo "crates/fixture-worker/Cargo.toml runs wasm-opt $manifest_opt, mk/artifacts.tsv says ${ARTIFACT_WASM_OPT[*]}" >&2
    exit 1
fi

cd crates/fixture-worker
"$WORKER_BUILD" --profile "$ARTIFACT_PROFILE" >&2

# The playground (www/), which wrangler.toml serves as static assets at /.
"$ROOT/scripts/build-js.sh" >&2

wasm=$(ls build/*.wasm | head -n 1)
raw=$(stat -c %s "$wasm")
gz=$(gzip -9 -n -c "$wasm" | wc -c)
echo "worker bundle: $wasm $raw bytes after wasm-opt, $gz bytes gzip (budget $BUDGET $ARTIFACT_OF)" >&2
if (($(artifact_size "$wasm") > BUDGET)); then
    echo "worker bundle over budget" >&2
    exit 1
fi
