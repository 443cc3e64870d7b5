#!/usr/bin/env bash
# Builds the example worker (crates/worker-example) with worker-build, offline:
# the pinned wasm-bindgen CLI, esbuild and wasm-opt (npm binaryen) are handed to
# it, so it downloads nothing. Output: crates/worker-example/build/ (index.js +
# the .wasm), which wrangler.toml's `main` points at; then the playground's wasm
# build into www/pkg (scripts/build-js.sh), which it serves at /.
#
#   scripts/build-worker.sh          # release build, prints the bundle size
#
# This is wrangler.toml's [build] command, so `npx wrangler dev` runs it too.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUDGET="${BQ_WORKER_BUDGET:-1048576}" # 1 MiB, gzip'd .wasm

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

# Size first: the bundle budget is 1 MiB.
export CARGO_PROFILE_RELEASE_OPT_LEVEL="${CARGO_PROFILE_RELEASE_OPT_LEVEL:-z}"
export CARGO_PROFILE_RELEASE_LTO=true
export CARGO_PROFILE_RELEASE_DEBUG=false
export CARGO_PROFILE_RELEASE_CODEGEN_UNITS=1

cd crates/worker-example
"$WORKER_BUILD" --release >&2

# The playground (www/), which wrangler.toml serves as static assets at /.
"$ROOT/scripts/build-js.sh" >&2

wasm=$(ls build/*.wasm | head -n 1)
raw=$(stat -c %s "$wasm")
gz=$(gzip -9 -c "$wasm" | wc -c)
echo "worker bundle: $wasm $raw bytes after wasm-opt, $gz bytes gzip (budget $BUDGET gzip)" >&2
if ((gz > BUDGET)); then
    echo "worker bundle over budget" >&2
    exit 1
fi
