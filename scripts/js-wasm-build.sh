#!/usr/bin/env bash
# Builds one JS package crate's cdylib for wasm32 in its artifact's cargo profile
# (mk/artifacts.tsv; the profile is in Cargo.toml), and prints the .wasm's path.
# Shared by scripts/build-js.sh and scripts/build-workers-js.sh.
#
#   scripts/js-wasm-build.sh ARTIFACT PACKAGE [cargo args...]
#
# `cargo rustc --crate-type cdylib`: with the manifest's extra `rlib` type cargo
# would skip LTO. Shorter source paths (kept in panic locations) save a few KB: the
# remaps are rustflags, which a profile in Cargo.toml cannot hold on stable cargo.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
. "$ROOT/scripts/artifact.sh" "$1"
PACKAGE="$2"
shift 2
cargo rustc -p "$PACKAGE" --lib --crate-type cdylib --target wasm32-unknown-unknown --profile "$ARTIFACT_PROFILE" \
    --config "build.rustflags=[\"--remap-path-prefix=${CARGO_HOME:-$HOME/.cargo}/registry/src=/cargo\", \"--remap-path-prefix=$ROOT=/bq-dedupe\"]" \
    "$@" >&2
lib="$(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
package = sys.argv[1]
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == package:
        print(next(t["name"] for t in p["targets"] if "lib" in t["kind"] or "cdylib" in t["kind"]))
' "$PACKAGE")"
echo "${CARGO_TARGET_DIR:-$ROOT/target}/wasm32-unknown-unknown/$ARTIFACT_PROFILE/${lib//-/_}.wasm"
