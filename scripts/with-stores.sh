#!/usr/bin/env bash
# Runs a command with every test server the store table names
# (crates/stores/src/backends.rs, BACKENDS: each `script:` line, in order),
# each script wrapping the next; the command sees every BQ_TEST_* variable.
set -euo pipefail
here=$(dirname "$0")
mapfile -t wrappers < <(grep -o 'script: "scripts/with-[a-z-]*\.sh"' "$here/../crates/stores/src/backends.rs" \
  | sed 's/^script: "scripts\///; s/"$//' | awk '!seen[$0]++')
(( ${#wrappers[@]} )) || { echo "with-stores: no script: lines in BACKENDS" >&2; exit 1; }
exec "${wrappers[@]/#/$here/}" "$@"
