#!/usr/bin/env bash
# Builds the bq-dedupe WebAssembly component (WIT world babelqueue:idempotency/dedupe)
# from crates/component, WASI-free:
#
#   scripts/build-component.sh        # -> target/component/bq_dedupe.component.wasm
#                                     #    and bq_dedupe_minimal.component.wasm
#   scripts/build-component.sh js     # ... and the jco transpile -> target/component/js/
#   scripts/build-component.sh test   # ... and `node --test crates/component/js/component.test.mjs`
#   BQ_COMPONENT_SMALL=1 scripts/build-component.sh   # both at opt-level z, to the same files
#
# Steps: cargo build (wasm32-unknown-unknown), wasm-opt (npm binaryen), then
# bq-componentize (the wit-component crate: encode, validate, list the imports,
# refuse any import outside babelqueue:idempotency/*); each component's cargo
# profile, wasm-opt flags and size budget are its row of mk/artifacts.tsv
# (`component`, `component-minimal`; `component-small` for both with
# BQ_COMPONENT_SMALL=1). Prints raw / wasm-opt / component / gzip sizes and fails
# when a component is over budget (BQ_COMPONENT_BUDGET overrides it for a run).
# Idempotent: cargo and npm only redo what changed.
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
mkdir -p "$OUT_DIR"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
size() { stat -c %s "$1"; }

# --- tools -----------------------------------------------------------------
# The wasm32 target and binaryen (the root package.json; npm ci only when stale).
"$ROOT/scripts/ensure-tools.sh" npm "$ROOT" >/dev/null
WASM_OPT="$ROOT/node_modules/.bin/wasm-opt"

if [[ -n "${BQ_COMPONENT_OPT_LEVEL:-}" ]]; then
    echo "BQ_COMPONENT_OPT_LEVEL is gone: BQ_COMPONENT_SMALL=1 builds at opt-level z (mk/artifacts.tsv)" >&2
    exit 2
fi
# --- components ----------------------------------------------------------------
# One guest, two worlds: `dedupe` (store + leases + handler imports) and, with the
# feature `minimal`, `dedupe-minimal` (seen-set + handler). Each has its own cargo
# target dir: a cdylib's file names carry no feature hash, so two feature sets in
# one dir would rebuild each other on every run.
cargo build --quiet --manifest-path "$ROOT/crates/component/componentize/Cargo.toml"
COMPONENTIZE="$CARGO_TARGET_DIR/debug/bq-componentize"
OVER=()

# build_component NAME ARTIFACT TARGET_DIR [CARGO FLAGS...]: target/component/NAME.component.wasm,
# built as row ARTIFACT of mk/artifacts.tsv says (or row component-small)
build_component() {
    local name="$1" artifact="$2" target_dir="$3" t raw opt out raw_size opt_size comp gz budget
    shift 3
    [[ -z "${BQ_COMPONENT_SMALL:-}" ]] || artifact=component-small
    . "$ROOT/scripts/artifact.sh" "$artifact"
    budget="${BQ_COMPONENT_BUDGET:-$ARTIFACT_BUDGET}"
    raw="$target_dir/wasm32-unknown-unknown/$ARTIFACT_PROFILE/babelqueue_dedupe_component.wasm"
    opt="$OUT_DIR/$name.$ARTIFACT_PROFILE.opt.wasm"
    out="$OUT_DIR/$name.component.wasm"
    t=$(now)
    CARGO_TARGET_DIR="$target_dir" cargo build -p babelqueue-dedupe-component \
        --target wasm32-unknown-unknown --profile "$ARTIFACT_PROFILE" "$@"
    echo "$name: cargo build (guest): $(since "$t")"

    t=$(now)
    # Features come from the module's target_features section; custom sections (the
    # component-type that wit-bindgen embeds) are kept.
    if [[ ! -f "$opt" || "$raw" -nt "$opt" || "$WASM_OPT" -nt "$opt" || "$ARTIFACTS_TSV" -nt "$opt" ]]; then
        "$WASM_OPT" "${ARTIFACT_WASM_OPT[@]}" --strip-debug --strip-producers "$raw" -o "$opt"
        echo "$name: wasm-opt ${ARTIFACT_WASM_OPT[*]}: $(since "$t")"
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
    if (($(artifact_size "$out") > budget)); then
        OVER+=("$name is $(artifact_size "$out") ($ARTIFACT_OF), its budget $budget")
    fi
}

build_component bq_dedupe component "$CARGO_TARGET_DIR"
build_component bq_dedupe_minimal component-minimal "$CARGO_TARGET_DIR-minimal" --features minimal

# --- JS (jco) ----------------------------------------------------------------
if [[ "$MODE" == js || "$MODE" == test ]]; then
    "$ROOT/scripts/ensure-tools.sh" npm "$JS_TOOLS" >/dev/null # jco
    t=$(now)
    rm -rf "$JS_OUT" "$JS_OUT-minimal"
    (cd "$JS_TOOLS" && npx @bytecodealliance/jco transpile "$OUT" \
        --instantiation async --name bq_dedupe -o "$JS_OUT" --quiet)
    # The minimal world's, for examples/jco-minimal.mjs.
    (cd "$JS_TOOLS" && npx @bytecodealliance/jco transpile "$OUT_DIR/bq_dedupe_minimal.component.wasm" \
        --instantiation async --name bq_dedupe_minimal -o "$JS_OUT-minimal" --quiet)
    echo "jco transpile: $(since "$t") -> ${JS_OUT#"$ROOT"/}/"
fi
if [[ "$MODE" == test ]]; then
    node --test "$JS_TOOLS/component.test.mjs"
fi

if ((${#OVER[@]})); then
    echo "OVER BUDGET (mk/artifacts.tsv, BQ_COMPONENT_BUDGET): ${OVER[*]}" >&2
    exit 1
fi
