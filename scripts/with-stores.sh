#!/usr/bin/env bash
# Runs a command with every test server the store table names
# (crates/stores/src/backends.rs, BACKENDS: each script it names, in order),
# each script wrapping the next; the command sees every BQ_TEST_* variable.
set -euo pipefail
here=$(dirname "$0")
mapfile -t wrappers < <(grep -o '"scripts/with-[a-z-]*\.sh"' "$here/../crates/stores/src/backends.rs" \
  | sed 's/^"scripts\///; s/"$//' | awk '!seen[$0]++')
(( ${#wrappers[@]} )) || { echo "with-stores: no scripts named in BACKENDS" >&2; exit 1; }
exec "${wrappers[@]/#/$here/}" "$@"
