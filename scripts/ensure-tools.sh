#!/usr/bin/env bash
# Installs the pinned build tools the wasm-bindgen targets (the JS package, the
# Workers adapter) need, skipping any already present at the right version:
#
#   scripts/ensure-tools.sh wasm-bindgen   # wasm-bindgen-cli (must equal Cargo.lock's wasm-bindgen)
#   scripts/ensure-tools.sh worker-build   # worker-build (workers-rs bundler)
#   scripts/ensure-tools.sh chromium       # Debian chromium (headless browser tests)
#   scripts/ensure-tools.sh python DIR PKG==VERSION
#                                          # a Python venv in DIR holding PKG at VERSION
#                                          # (Debian python3-venv if venv is missing)
#   scripts/ensure-tools.sh npm DIR        # `npm ci` in DIR (its committed package-lock.json)
#                                          # when node_modules is missing or older than
#                                          # package(-lock).json
#
# Prints the tool's path on stdout; progress goes to stderr.
set -euo pipefail

WASM_BINDGEN_VERSION=0.2.130
WORKER_BUILD_VERSION=0.8.7

have_version() { # have_version BIN VERSION
    command -v "$1" >/dev/null 2>&1 && "$1" --version 2>/dev/null | grep -qw -- "$2"
}

rustup target list --installed | grep -qx wasm32-unknown-unknown \
    || rustup target add wasm32-unknown-unknown >&2

case "${1:?usage: $0 wasm-bindgen|worker-build|chromium|python DIR PKG==VERSION|npm DIR}" in
wasm-bindgen)
    # Locked first: the release's own dependency versions. The index this
    # project's machines read lacks one version that lock names (webpki-roots
    # 1.0.11), so a failed locked install falls back to the newest compatible
    # versions, the CLI itself still at the pinned version.
    if ! have_version wasm-bindgen "$WASM_BINDGEN_VERSION"; then
        cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" --locked >&2 || {
            echo "== wasm-bindgen-cli: the locked install failed; installing with fresh dependency versions" >&2
            cargo install wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION" >&2 # unlocked fallback
        }
    fi
    command -v wasm-bindgen
    ;;
worker-build)
    have_version worker-build "$WORKER_BUILD_VERSION" \
        || cargo install worker-build --version "$WORKER_BUILD_VERSION" --locked >&2
    command -v worker-build
    ;;
chromium)
    if ! command -v chromium >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
        $SUDO apt-get install -y chromium >&2 \
            || { $SUDO apt-get update >&2 && $SUDO apt-get install -y chromium >&2; }
    fi
    command -v chromium
    ;;
python)
    dir="${2:?usage: $0 python DIR PKG==VERSION}"
    want="${3:?usage: $0 python DIR PKG==VERSION}"
    have=$("$dir/bin/python" -m pip show "${want%%==*}" 2>/dev/null || true)
    if ! grep -qx "Version: ${want#*==}" <<<"$have"; then
        if ! python3 -m venv --help >/dev/null 2>&1 || ! python3 -c 'import ensurepip' 2>/dev/null; then
            export DEBIAN_FRONTEND=noninteractive
            SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
            $SUDO apt-get install -y python3-venv >&2 \
                || { $SUDO apt-get update >&2 && $SUDO apt-get install -y python3-venv >&2; }
        fi
        echo "== python venv $dir with $want" >&2
        python3 -m venv "$dir" >&2
        "$dir/bin/python" -m pip install --quiet --disable-pip-version-check "$want" >&2
    fi
    echo "$dir/bin/python"
    ;;
npm)
    # `npm ci`: exactly the committed lock file, which it never rewrites (`npm
    # install` may, so a test run would leave the tree changed); it fails when the
    # lock does not match package.json. Every tools folder commits its lock.
    dir="${2:?usage: $0 npm DIR}"
    if [[ ! -f "$dir/package-lock.json" ]]; then
        echo "no package-lock.json in $dir: make one (npm install --package-lock-only) and commit it" >&2
        exit 1
    fi
    stamp="$dir/node_modules/.package-lock.json"
    if [[ ! -f "$stamp" || "$dir/package.json" -nt "$stamp" || "$dir/package-lock.json" -nt "$stamp" ]]; then
        echo "== npm ci in $dir" >&2
        (cd "$dir" && npm ci --no-audit --no-fund) >&2
        touch "$stamp"
    fi
    echo "$dir/node_modules"
    ;;
*)
    echo "unknown tool: $1" >&2
    exit 2
    ;;
esac
