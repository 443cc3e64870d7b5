#!/usr/bin/env bash
# Runs a command with a throwaway redis-server on loopback, and stops it after.
# The command sees BQ_TEST_REDIS_URL. Installs redis-server (Debian) if missing.
set -euo pipefail

if ! command -v redis-server >/dev/null; then
  echo "with-redis: installing redis-server"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi

dir=$(mktemp -d)
port=""
stop() {
  [[ -n $port ]] && redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  [[ -f $dir/redis.pid ]] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT

# A free port: let the kernel pick one, then hand it to redis. Another process
# can take it in between (redis then fails to bind, and a ping reaches that
# process), so a start that does not answer PONG from our own server is tried
# again on another port.
for attempt in 1 2 3 4 5; do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
  rm -f "$dir/redis.pid"
  redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir"
  for _ in $(seq 50); do
    [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] && break
    sleep 0.1
  done
  if [[ $(redis-cli -p "$port" ping 2>/dev/null) == PONG ]] &&
    [[ -f $dir/redis.pid ]] && kill -0 "$(cat "$dir/redis.pid")" 2>/dev/null; then
    break
  fi
  echo "with-redis: no redis on port $port (attempt $attempt); its log:" >&2
  tail -n 5 "$dir/redis.log" >&2 || true
  [[ -f $dir/redis.pid ]] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  port=""
  [[ $attempt == 5 ]] && exit 1
done
echo "with-redis: redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on 127.0.0.1:$port"

export BQ_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
"$@"
