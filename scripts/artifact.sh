# Sourced, not run: `. scripts/artifact.sh NAME` reads row NAME of mk/artifacts.tsv
# (one wasm artifact's cargo profile, wasm-opt flags and size budget) into
#
#   ARTIFACT_PROFILE     the cargo profile (Cargo.toml)
#   ARTIFACT_WASM_OPT    the wasm-opt flags (an array; empty for "-")
#   ARTIFACT_BUDGET      the budget, in ARTIFACT_OF
#   ARTIFACT_OF          bytes (of the file) or gzip (of its gzip -9)
#   ARTIFACT_FILE        the file measured, from the root ("-": none of its own)
#
# and defines `artifact_size FILE`: FILE's size in ARTIFACT_OF. Exits when NAME
# has no row.

ARTIFACTS_TSV="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/mk/artifacts.tsv"
_artifact_row="$(awk -F'\t' -v name="${1:?usage: . scripts/artifact.sh NAME}" '$1 == name' "$ARTIFACTS_TSV")"
if [[ -z "$_artifact_row" ]]; then
    echo "mk/artifacts.tsv has no row '$1'" >&2
    exit 1
fi
IFS=$'\t' read -r _ ARTIFACT_PROFILE _artifact_opt ARTIFACT_BUDGET ARTIFACT_OF ARTIFACT_FILE _ <<<"$_artifact_row"
ARTIFACT_WASM_OPT=()
[[ "$_artifact_opt" == - ]] || read -r -a ARTIFACT_WASM_OPT <<<"$_artifact_opt"

artifact_size() {
    case "$ARTIFACT_OF" in
    bytes) stat -c %s "$1" ;;
    gzip) gzip -9 -n -c <"$1" | wc -c ;;
    *)
        echo "mk/artifacts.tsv: a budget counts bytes or gzip, not '$ARTIFACT_OF'" >&2
        return 1
        ;;
    esac
}
