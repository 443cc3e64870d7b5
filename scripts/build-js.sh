#!/usr/bin/env bash
# Builds the JavaScript package of bq-dedupe (crates/js, wasm-bindgen) and the
# playground's copy of it:
#
#   scripts/build-js.sh            # -> crates/js/pkg/{web,node}/, www/pkg/, www/conformance/
#                                  #    (also `npm pack`'s prepack step in crates/js)
#   scripts/build-js.sh test       # ... and pkg/conformance-node/: a test build with the core's
#                                  #     conformance runner (feature `conformance`), for the Node tests
#
# Steps (the cargo profile, wasm-opt flags and size budget are row `js` of
# mk/artifacts.tsv): cargo build (wasm32-unknown-unknown, scripts/js-wasm-build.sh),
# wasm-bindgen --target web and --target nodejs (the CLI pinned to Cargo.lock's
# wasm-bindgen, scripts/ensure-tools.sh), wasm-opt (npm binaryen, pinned in the root
# package.json). Prints the raw / wasm-bindgen / wasm-opt / gzip sizes and fails when
# the shipped .wasm is over budget (BQ_JS_BUDGET overrides it for a run).
# Idempotent: cargo, npm and wasm-opt only redo what changed.
set -euo pipefail

MODE="${1:-build}"
case "$MODE" in build | test) ;; *)
    echo "usage: $0 [build|test]" >&2
    exit 2
    ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JS="$ROOT/crates/js"
PKG="$JS/pkg"
WWW="$ROOT/www"
. "$ROOT/scripts/artifact.sh" js
BUDGET="${BQ_JS_BUDGET:-$ARTIFACT_BUDGET}"
NAME=bq_dedupe

now() { date +%s.%N; }

# The JS half of the package's crossings (crates/js/src/glue.js) is a wasm-bindgen
# snippet, an ES module; the nodejs glue is CommonJS and `require`s it. Its copy in
# DIR becomes CommonJS (.cjs, `export` dropped, `exports.NAME` added), so a Node
# without require(esm) loads it too, and the glue DIR/GLUE requires that copy.
cjs_snippets() {
    local dir="$1" glue="$2" f names
    while IFS= read -r f; do
        names="$(sed -n -E 's/^export (async function|function|class) ([A-Za-z_$][A-Za-z0-9_$]*).*/\2/p' "$f")"
        { sed -E 's/^export (async function|function|class) /\1 /' "$f"; for n in $names; do echo "exports.$n = $n;"; done; } >"${f%.js}.cjs"
        rm "$f"
        if grep -nE '^\s*(export|import)\b' "${f%.js}.cjs"; then
            echo "$f: a snippet with more than 'export [async] function|class' cannot become CommonJS here" >&2
            exit 1
        fi
    done < <(find "$dir/snippets" -name '*.js')
    # Both of wasm-bindgen's forms: String.raw`...` for a shim's imports, "..." for
    # a function the module imports directly (the import map's key, the module's
    # own name for it, stays .js).
    sed -i -E -e 's|(require\(String\.raw`\./snippets/[^`]*)\.js`\)|\1.cjs`)|' \
        -e 's|(require\("\./snippets/[^"]*)\.js"\)|\1.cjs")|' "$glue"
    if grep -nE 'require\((String\.raw`|")\./snippets/[^`"]*\.js' "$glue"; then
        echo "$glue still requires an ES module snippet" >&2
        exit 1
    fi
}
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
size() { stat -c %s "$1"; }

# --- tools -------------------------------------------------------------------
WB="$("$ROOT/scripts/ensure-tools.sh" wasm-bindgen)"
"$ROOT/scripts/ensure-tools.sh" npm "$ROOT" >/dev/null # binaryen (the root package.json)
WASM_OPT="$ROOT/node_modules/.bin/wasm-opt"

# --- the module ----------------------------------------------------------------
t=$(now)
RAW="$("$ROOT/scripts/js-wasm-build.sh" js babelqueue-dedupe-js)"
echo "cargo build: $(since "$t")"

# --- wasm-bindgen (web + nodejs) and wasm-opt -------------------------------------
STAMP="$PKG/.built"
if [[ ! -f "$STAMP" || "$RAW" -nt "$STAMP" || "$WASM_OPT" -nt "$STAMP" || "${BASH_SOURCE[0]}" -nt "$STAMP" || "$ARTIFACTS_TSV" -nt "$STAMP" ]]; then
    t=$(now)
    # Only the shipped builds: the test build (conformance-node/) is its own, and
    # a test run that rebuilds the module must not take it from under the others.
    rm -rf "$PKG/web" "$PKG/node" "$PKG/bindgen.wasm"
    mkdir -p "$PKG"
    "$WB" --target web --out-dir "$PKG/web" --out-name "$NAME" "$RAW"
    "$WB" --target nodejs --out-dir "$PKG/node" --out-name "$NAME" "$RAW"
    # One .wasm for both: the two targets differ only in their JS glue (the module's
    # imports are named the same), so pkg/node/ loads pkg/web/'s copy. Checked here,
    # so a wasm-bindgen that made them differ fails the build instead of shipping the
    # wrong module to Node.
    if ! cmp -s "$PKG/web/${NAME}_bg.wasm" "$PKG/node/${NAME}_bg.wasm"; then
        echo "wasm-bindgen's web and nodejs modules differ: pkg/node/ can no longer share pkg/web/${NAME}_bg.wasm" >&2
        exit 1
    fi
    rm "$PKG/node/${NAME}_bg.wasm" "$PKG/node/${NAME}_bg.wasm.d.ts"
    # The package is "type": "module"; the nodejs glue is CommonJS: .cjs, typed by a
    # .d.cts (a .d.ts there would be read as ESM, and `import x = require()` fails
    # with TS1471 under node16/nodenext).
    mv "$PKG/node/$NAME.js" "$PKG/node/$NAME.cjs"
    mv "$PKG/node/$NAME.d.ts" "$PKG/node/$NAME.d.cts"
    cjs_snippets "$PKG/node" "$PKG/node/$NAME.cjs"
    grep -q '^const wasmPath = `${__dirname}/'"${NAME}_bg.wasm"'`;$' "$PKG/node/$NAME.cjs" || {
        echo "the nodejs glue no longer loads its module as expected (wasmPath)" >&2
        exit 1
    }
    sed -i 's|^const wasmPath = `${__dirname}/|const wasmPath = `${__dirname}/../web/|' "$PKG/node/$NAME.cjs"
    # The .d.ts: options arguments are optional (unchecked_param_type drops the `?`),
    # the raw wasm exports of InitOutput say `unknown`, not `any`, and `Symbol.dispose`
    # (InMemoryStore's [Symbol.dispose]) is declared, so no `lib` setting
    # (esnext.disposable) is needed; it merges with the lib's own declaration.
    for dts in "$PKG/web/$NAME.d.ts" "$PKG/node/$NAME.d.cts"; do
        sed -i -E -e 's/\b(options): (DedupeOptions|InMemoryStoreOptions)\)/\1?: \2)/' \
            -e '/^    readonly /s/\bany\b/unknown/g' "$dts"
        cat >>"$dts" <<'DTS'

declare global {
    interface SymbolConstructor {
        /** `Symbol.dispose` (explicit resource management), declared so that no `lib` setting is needed. */
        readonly dispose: unique symbol;
    }
}
DTS
    done
    sed -i -E '/^export const /s/\bany\b/unknown/g' "$PKG/web/${NAME}_bg.wasm.d.ts"
    if grep -nw any "$PKG"/web/*.d.ts "$PKG"/node/*.d.cts | grep -v '^\S*:[0-9]*: *\*\|//'; then
        echo "the .d.ts mentions 'any'" >&2
        exit 1
    fi
    echo "wasm-bindgen: $(since "$t")"
    t=$(now)
    cp "$PKG/web/${NAME}_bg.wasm" "$PKG/bindgen.wasm"
    "$WASM_OPT" "${ARTIFACT_WASM_OPT[@]}" --strip-debug --strip-producers \
        --enable-reference-types --enable-bulk-memory --enable-nontrapping-float-to-int \
        --enable-sign-ext --enable-mutable-globals --enable-multivalue \
        "$PKG/bindgen.wasm" -o "$PKG/web/${NAME}_bg.wasm"
    echo "wasm-opt ${ARTIFACT_WASM_OPT[*]}: $(since "$t")"
    touch "$STAMP"
else
    echo "wasm-bindgen + wasm-opt: up to date"
fi

# --- the playground's copy ----------------------------------------------------------
mkdir -p "$WWW/pkg" "$WWW/conformance"
rm -rf "$WWW/pkg/snippets"
cp "$PKG/web/$NAME.js" "$PKG/web/$NAME.d.ts" "$PKG/web/${NAME}_bg.wasm" "$JS/conformance.js" "$WWW/pkg/"
cp -r "$PKG/web/snippets" "$WWW/pkg/"
cp "$ROOT/tests/conformance/manifest.json" "$WWW/conformance/"
cp -r "$ROOT/tests/conformance/fixtures" "$WWW/conformance/"

raw=$(size "$RAW")
bg=$(size "$PKG/bindgen.wasm")
opt=$(size "$PKG/web/${NAME}_bg.wasm")
gz=$(gzip -9 -n -c <"$PKG/web/${NAME}_bg.wasm" | wc -c)
printf 'sizes: raw %d B, wasm-bindgen %d B, wasm-opt %d B (%.1f KiB), gzip -9 %d B (%.1f KiB)\n' \
    "$raw" "$bg" "$opt" "$(echo "$opt / 1024" | bc -l)" "$gz" "$(echo "$gz / 1024" | bc -l)"
echo "wrote ${PKG#"$ROOT"/}/{web,node}/ and www/pkg/"

# --- the test build with the core's conformance runner (not published) ---------
if [[ "$MODE" == test ]]; then
    t=$(now)
    cargo rustc -p babelqueue-dedupe-js --lib --crate-type cdylib --target wasm32-unknown-unknown \
        --features conformance,testkit --profile js-conformance
    TRAW="${CARGO_TARGET_DIR:-$ROOT/target}/wasm32-unknown-unknown/js-conformance/bq_dedupe_js.wasm"
    TOUT="$PKG/conformance-node"
    if [[ ! -f "$TOUT/$NAME.cjs" || "$TRAW" -nt "$TOUT/$NAME.cjs" ]]; then
        rm -rf "$TOUT"
        "$WB" --target nodejs --out-dir "$TOUT" --out-name "$NAME" "$TRAW"
        mv "$TOUT/$NAME.js" "$TOUT/$NAME.cjs"
        cjs_snippets "$TOUT" "$TOUT/$NAME.cjs"
    fi
    echo "conformance test build: $(since "$t") -> ${TOUT#"$ROOT"/}/"
fi

measured=$(artifact_size "$PKG/web/${NAME}_bg.wasm")
if ((measured > BUDGET)); then
    echo "OVER BUDGET: ${NAME}_bg.wasm is $measured ($ARTIFACT_OF), the budget is $BUDGET (mk/artifacts.tsv, BQ_JS_BUDGET)" >&2
    exit 1
fi
