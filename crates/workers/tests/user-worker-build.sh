#!/usr/bin/env bash
# Builds examples/user-worker as a user would: a crate of its own OUTSIDE the
# bq-dedupe workspace, next to a checkout of bq-dedupe, with only the files in
# examples/user-worker (Cargo.toml, wrangler.toml, src/) copied verbatim:
#
#   SCRATCH/bq-dedupe -> this checkout (the README's path dependency)
#   SCRATCH/my-worker/   examples/user-worker + Cargo.lock (the workspace's, so
#                        wasm-bindgen stays 0.2.130 = the CLI worker-build runs)
#
#   crates/workers/tests/user-worker-build.sh SCRATCH   # prints SCRATCH/my-worker
#
# worker-build runs offline as in scripts/build-worker.sh (pinned wasm-bindgen,
# npm esbuild and binaryen). The target directory is kept under target/ so a
# rebuild compiles only the crates that changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
SCRATCH="${1:?usage: $0 SCRATCH_DIR (outside the workspace)}"
case "$(realpath -m "$SCRATCH")/" in
"$ROOT"/*) echo "$SCRATCH is inside the workspace: cargo would take it for a member" >&2; exit 2 ;;
esac

export WASM_BINDGEN_BIN="$("$ROOT/scripts/ensure-tools.sh" wasm-bindgen)"
WORKER_BUILD="$("$ROOT/scripts/ensure-tools.sh" worker-build)"
"$ROOT/scripts/ensure-tools.sh" npm "$ROOT" >/dev/null
case "$(uname -m)" in
x86_64) esbuild_pkg=linux-x64 ;;
aarch64 | arm64) esbuild_pkg=linux-arm64 ;;
*) esbuild_pkg="linux-$(uname -m)" ;;
esac
export ESBUILD_BIN="$ROOT/node_modules/@esbuild/$esbuild_pkg/bin/esbuild"
export WASM_OPT_BIN="$ROOT/node_modules/.bin/wasm-opt"
export CARGO_TARGET_DIR="$ROOT/target/user-worker"

rm -rf "$SCRATCH/my-worker"
mkdir -p "$SCRATCH/my-worker"
ln -sfn "$ROOT" "$SCRATCH/bq-dedupe"
cp -R "$ROOT/examples/user-worker/Cargo.toml" "$ROOT/examples/user-worker/wrangler.toml" \
    "$ROOT/examples/user-worker/src" "$SCRATCH/my-worker/"
cp "$ROOT/Cargo.lock" "$SCRATCH/my-worker/Cargo.lock"
cd "$SCRATCH/my-worker"
"$WORKER_BUILD" --release >&2
ls build/index.js >/dev/null
echo "$SCRATCH/my-worker"
