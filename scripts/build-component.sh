#!/usr/bin/env bash
# Builds the bq-dedupe WebAssembly component (WIT world babelqueue:idempotency/dedupe)
# from crates/component, WASI-free:
#
#   scripts/build-component.sh        # -> target/component/bq_dedupe.component.wasm
#                                     #    and bq_dedupe_minimal.component.wasm
#   scripts/build-component.sh js     # ... and the jco transpile -> target/component/js/
#   scripts/build-component.sh test   # ... and `node --test crates/component/js/component.test.mjs`
#
# Steps: cargo build (wasm32-unknown-unknown, profile `component` at opt-level 3), wasm-opt -O3 (-Oz for a small build)
# (npm binaryen@132.0.0), then bq-componentize (the wit-component crate: encode,
# validate, list the imports, refuse any import outside babelqueue:idempotency/*).
# Prints raw / wasm-opt / component / gzip sizes and fails when the component is
# over budget (BQ_COMPONENT_BUDGET bytes, default 256 KiB: the component serves
# server-side hosts; the JS package keeps its own 180 KiB budget). Idempotent: cargo and
# npm only redo what changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE="${1:-build}"
case "$MODE" in build | js | test) ;; *)
    echo "usage: $0 [build|js|test]" >&2
    exit 2
    ;;
esac

# The component's own cargo target dir (another build may use target/ at the same time).
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/component}"
OUT_DIR="$ROOT/target/component"
OUT="$OUT_DIR/bq_dedupe.component.wasm"
JS_OUT="$OUT_DIR/js"
JS_TOOLS="$ROOT/crates/component/js"
BUDGET="${BQ_COMPONENT_BUDGET:-262144}"
mkdir -p "$OUT_DIR"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
size() { stat -c %s "$1"; }

# --- tools -----------------------------------------------------------------
# The wasm32 target, and binaryen + jco (npm install only when stale).
"$ROOT/scripts/ensure-tools.sh" npm "$JS_TOOLS" >/dev/null
WASM_OPT="$JS_TOOLS/node_modules/.bin/wasm-opt"

# --- guest module ------------------------------------------------------------
# No debug info in the shipped module (the `component` profile inherits release's
# line tables): set here because the profile lives in the root Cargo.toml.
export CARGO_PROFILE_COMPONENT_DEBUG=false
export CARGO_PROFILE_COMPONENT_STRIP=debuginfo
# Built for speed: the component serves server-side hosts and has 256 KiB, and
# opt-level 3 fits (the profile's "z" is what the 150 KiB budget once needed;
# BQ_COMPONENT_OPT_LEVEL=z builds the small one). The JS package has its own profile.
export CARGO_PROFILE_COMPONENT_OPT_LEVEL="${BQ_COMPONENT_OPT_LEVEL:-3}"
case "$CARGO_PROFILE_COMPONENT_OPT_LEVEL" in z | s) WASM_OPT_FLAG=-Oz ;; *) WASM_OPT_FLAG=-O3 ;; esac
# --- components ----------------------------------------------------------------
# One guest, two worlds: `dedupe` (store + leases + handler imports) and, with the
# feature `minimal`, `dedupe-minimal` (seen-set + handler). Each has its own cargo
# target dir: a cdylib's file names carry no feature hash, so two feature sets in
# one dir would rebuild each other on every run.
cargo build --quiet --manifest-path "$ROOT/crates/component/componentize/Cargo.toml"
COMPONENTIZE="$CARGO_TARGET_DIR/debug/bq-componentize"
OVER=()

# build_component NAME TARGET_DIR [CARGO FLAGS...]: target/component/NAME.component.wasm
build_component() {
    local name="$1" target_dir="$2" t raw opt out raw_size opt_size comp gz
    shift 2
    raw="$target_dir/wasm32-unknown-unknown/component/babelqueue_dedupe_component.wasm"
    opt="$OUT_DIR/$name.opt.wasm"
    out="$OUT_DIR/$name.component.wasm"
    t=$(now)
    CARGO_TARGET_DIR="$target_dir" cargo build -p babelqueue-dedupe-component \
        --target wasm32-unknown-unknown --profile component "$@"
    echo "$name: cargo build (guest): $(since "$t")"

    t=$(now)
    # Features come from the module's target_features section; custom sections (the
    # component-type that wit-bindgen embeds) are kept.
    if [[ ! -f "$opt" || "$raw" -nt "$opt" || "$WASM_OPT" -nt "$opt" ]]; then
        "$WASM_OPT" "$WASM_OPT_FLAG" --strip-debug --strip-producers "$raw" -o "$opt"
        echo "$name: wasm-opt $WASM_OPT_FLAG: $(since "$t")"
    fi

    t=$(now)
    "$COMPONENTIZE" "$opt" "$out"
    echo "$name: componentize: $(since "$t")"

    raw_size=$(size "$raw")
    opt_size=$(size "$opt")
    comp=$(size "$out")
    gz=$(gzip -9 -n -c <"$out" | wc -c)
    printf '%s sizes: raw %d B, wasm-opt %d B, component %d B (%.1f KiB), gzip -9 %d B (%.1f KiB)\n' \
        "$name" "$raw_size" "$opt_size" "$comp" "$(echo "$comp / 1024" | bc -l)" "$gz" "$(echo "$gz / 1024" | bc -l)"
    echo "wrote ${out#"$ROOT"/}"
    if ((comp > BUDGET)); then
        OVER+=("$name is $comp bytes")
    fi
}

build_component bq_dedupe "$CARGO_TARGET_DIR"
build_component bq_dedupe_minimal "$CARGO_TARGET_DIR-minimal" --features minimal

# --- JS (jco) ----------------------------------------------------------------
if [[ "$MODE" == js || "$MODE" == test ]]; then
    t=$(now)
    rm -rf "$JS_OUT"
    (cd "$JS_TOOLS" && npx @bytecodealliance/jco transpile "$OUT" \
        --instantiation async --name bq_dedupe -o "$JS_OUT" --quiet)
    echo "jco transpile: $(since "$t") -> ${JS_OUT#"$ROOT"/}/"
fi
if [[ "$MODE" == test ]]; then
    node --test "$JS_TOOLS/component.test.mjs"
fi

if ((${#OVER[@]})); then
    echo "OVER BUDGET (BQ_COMPONENT_BUDGET = $BUDGET bytes): ${OVER[*]}" >&2
    exit 1
fi
