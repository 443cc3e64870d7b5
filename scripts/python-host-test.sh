#!/usr/bin/env bash
# Runs the `dedupe-minimal` component from a host written in Python (wasmtime-py):
# the host provides `seen-set` (seen, remember, forget) and `handler.handle`, and
# nothing else. Builds the components first (idempotent).
#
#   scripts/python-host-test.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WASMTIME_PY_VERSION=50.0.1

"$ROOT/scripts/build-component.sh" >/dev/null
PYTHON=$("$ROOT/scripts/ensure-tools.sh" python "$ROOT/target/py-host" "wasmtime==$WASMTIME_PY_VERSION")
export BQ_MINIMAL_COMPONENT="$ROOT/target/component/bq_dedupe_minimal.component.wasm"
"$PYTHON" -m unittest discover -s "$ROOT/crates/component/py" -v
