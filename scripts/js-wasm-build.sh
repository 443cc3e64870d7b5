#!/usr/bin/env bash
# Builds one JS package crate's cdylib for wasm32 in the package's `js` profile
# (release at opt-level s, fat LTO, panic=abort, no debug info; defined here with
# --config because the profiles live in the root Cargo.toml), and prints the
# .wasm's path. Shared by scripts/build-js.sh and scripts/build-workers-js.sh.
#
#   scripts/js-wasm-build.sh PACKAGE [cargo args...]
#
# `cargo rustc --crate-type cdylib`: with the manifest's extra `rlib` type cargo
# would skip LTO. Shorter source paths (kept in panic locations) save a few KB.
# opt-level s, not z: z made the JS package about 15 % slower for 10 KB less
# (bench/README.md, issue #19).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACKAGE="$1"
shift
cargo rustc -p "$PACKAGE" --lib --crate-type cdylib --target wasm32-unknown-unknown --profile js \
    --config 'profile.js.inherits="release"' \
    --config 'profile.js.opt-level="s"' \
    --config 'profile.js.lto=true' \
    --config 'profile.js.codegen-units=1' \
    --config 'profile.js.panic="abort"' \
    --config 'profile.js.debug=false' \
    --config "build.rustflags=[\"--remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}/registry/src=/cargo\", \"--remap-path-prefix=$ROOT=/bq-dedupe\"]" \
    "$@" >&2
lib="$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
package = sys.argv[1]
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == package:
        print(next(t["name"] for t in p["targets"] if "lib" in t["kind"] or "cdylib" in t["kind"]))
' "$PACKAGE")"
echo "${CARGO_TARGET_DIR:-$ROOT/target}/wasm32-unknown-unknown/js/${lib//-/_}.wasm"
