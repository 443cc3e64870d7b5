#!/usr/bin/env bash
# Instructions per delivery of the native core at two revisions, telemetry off:
# bench/instructions.rs built against each (a scratch crate with a path
# dependency on a git worktree of the revision), run under valgrind's cachegrind
# (instruction counts only), less the cost of making the lines.
#
#   bench/instructions.sh BASE [HEAD]     # HEAD defaults to the working tree
#
# Needs valgrind. Prints one line per mode and revision and the change.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="${1:?usage: $0 BASE [HEAD]}"
HEAD="${2:-}"
WORK="$(mktemp -d)"
trap 'git -C "$ROOT" worktree remove --force "$WORK/base" >/dev/null 2>&1 || true; [ -n "$HEAD" ] && git -C "$ROOT" worktree remove --force "$WORK/head" >/dev/null 2>&1; rm -rf "$WORK"' EXIT
git -C "$ROOT" worktree add --detach "$WORK/base" "$BASE" >/dev/null 2>&1
if [ -n "$HEAD" ]; then git -C "$ROOT" worktree add --detach "$WORK/head" "$HEAD" >/dev/null 2>&1; head_tree="$WORK/head"; else head_tree="$ROOT"; fi
export CARGO_TARGET_DIR="$WORK/target"
build() { # name tree
    mkdir -p "$WORK/$1-bin"
    cat >"$WORK/$1-bin/Cargo.toml" <<TOML
[package]
name = "instructions"
version = "0.0.0"
edition = "2024"
[[bin]]
name = "instructions"
path = "$ROOT/bench/instructions.rs"
[dependencies]
babelqueue-dedupe = { path = "$2" }
[workspace]
TOML
    cp "$2/Cargo.lock" "$WORK/$1-bin/"
    (cd "$WORK/$1-bin" && cargo build --quiet --release)
    cp "$CARGO_TARGET_DIR/release/instructions" "$WORK/$1.bin"
}
build base "$WORK/base"
build head "$head_tree"
count() { valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null "$WORK/$1.bin" "$2" 2>&1 | awk '/I *refs/ { gsub(",", "", $4); print $4 }'; }
for rev in base head; do eval "none_$rev=$(count $rev none)"; done
for mode in process batch; do
    b=$(( $(count base $mode) - none_base )); h=$(( $(count head $mode) - none_head ))
    awk -v m="$mode" -v b="$b" -v h="$h" 'BEGIN { printf "%-8s base %.0f  head %.0f instructions per delivery  (%+.2f %%)\n", m, b / 1e6, h / 1e6, (h - b) * 100 / b }'
done
