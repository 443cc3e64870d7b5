#!/usr/bin/env bash
# Runs a command with a throwaway redis-server on loopback that speaks TLS only,
# its certificate signed by a CA made here, and stops it after. The command sees
# BQ_TEST_REDIS_TLS_URL (rediss://) and BQ_TEST_REDIS_TLS_CA (the CA's PEM file).
# Needs redis-server built with TLS (Debian's is) and openssl.
set -euo pipefail

command -v redis-server >/dev/null || { echo "with-redis-tls: redis-server is missing (scripts/with-redis.sh installs it)" >&2; exit 1; }
if ! command -v openssl >/dev/null; then
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq openssl >/dev/null
fi
dir=$(mktemp -d)
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=bq-dedupe test CA" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$dir/san.ext"
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 2 -extfile "$dir/san.ext" -out "$dir/server.crt" 2>/dev/null

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
redis-server --bind 127.0.0.1 --port 0 --tls-port "$port" --tls-cert-file "$dir/server.crt" \
  --tls-key-file "$dir/server.key" --tls-ca-cert-file "$dir/ca.crt" --tls-auth-clients no \
  --save '' --appendonly no --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir"
stop() {
  kill "$(cat "$dir/redis.pid" 2>/dev/null)" 2>/dev/null || true
  rm -rf "$dir"
}
trap stop EXIT
for _ in $(seq 50); do
  redis-cli --tls --cacert "$dir/ca.crt" -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
redis-cli --tls --cacert "$dir/ca.crt" -h 127.0.0.1 -p "$port" ping >/dev/null
echo "with-redis-tls: redis-server over TLS on 127.0.0.1:$port"

export BQ_TEST_REDIS_TLS_URL="rediss://127.0.0.1:$port/0"
export BQ_TEST_REDIS_TLS_CA="$dir/ca.crt"
"$@"
