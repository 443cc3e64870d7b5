#!/usr/bin/env bash
# Runs a command with a throwaway redis-server on loopback, and stops it after.
# The command sees BQ_TEST_REDIS_URL. Installs redis-server (Debian) if missing.
set -euo pipefail

if ! command -v redis-server >/dev/null; then
  echo "with-redis: installing redis-server"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi

# A free port: let the kernel pick one, then hand it to redis.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
dir=$(mktemp -d)
redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir"
stop() {
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT
for _ in $(seq 50); do
  redis-cli -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli -p "$port" ping >/dev/null
echo "with-redis: redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on 127.0.0.1:$port"

export BQ_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
"$@"
