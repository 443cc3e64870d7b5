#!/usr/bin/env bash
# Runs a command with throwaway Redis servers on loopback that speak TLS only,
# their certificate signed by a CA made here (scripts/test-ca.sh), and stops them
# after: one server and a 3-node Redis Cluster. The command sees
# BQ_TEST_REDIS_TLS_URL (rediss://), BQ_TEST_REDIS_TLS_CLUSTER_URL
# (rediss+cluster://, every node), BQ_TEST_REDIS_TLS_CA (the CA's PEM file) and
# BQ_TEST_OTHER_CA (a CA that signed nothing here).
# Needs redis-server built with TLS (Debian's is).
set -euo pipefail

command -v redis-server >/dev/null || { echo "with-redis-tls: redis-server is missing (scripts/with-redis.sh installs it)" >&2; exit 1; }
here=$(dirname "$0")
dir=$(mktemp -d)
"$here/test-ca.sh" "$dir"
pids=()
stop() {
  for p in "${pids[@]}"; do kill "$(cat "$p" 2>/dev/null)" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap stop EXIT
source "$here/redis-cluster-lib.sh"
cli() { redis-cli --tls --cacert "$dir/ca.crt" -h 127.0.0.1 "$@"; }
# serve PORT [ARGS...]: a TLS-only server in its own directory.
serve() {
  local port=$1; shift
  mkdir -p "$dir/$port"
  redis-server --bind 127.0.0.1 --port 0 --tls-port "$port" --tls-cert-file "$dir/server.crt" \
    --tls-key-file "$dir/server.key" --tls-ca-cert-file "$dir/ca.crt" --tls-auth-clients no \
    --save '' --appendonly no --daemonize yes --pidfile "$dir/$port/redis.pid" \
    --logfile "$dir/$port/redis.log" --dir "$dir/$port" "$@"
  pids+=("$dir/$port/redis.pid")
  for _ in $(seq 50); do cli -p "$port" ping >/dev/null 2>&1 && return; sleep 0.1; done
  cli -p "$port" ping >/dev/null
}

single=$(free_port)
serve "$single"
pick_cluster_ports nodes "$single"
for p in "${nodes[@]}"; do
  serve "$p" --cluster-enabled yes --cluster-config-file "$dir/$p/nodes.conf" --tls-cluster yes
done
form_cluster cli "$dir/create.log" "${nodes[@]}" \
  || { echo "with-redis-tls: the TLS cluster did not come up"; exit 1; }
echo "with-redis-tls: redis-server over TLS on 127.0.0.1:$single, a TLS cluster on 127.0.0.1:${nodes[*]}"

list=$(printf '127.0.0.1:%s,' "${nodes[@]}")
export BQ_TEST_REDIS_TLS_URL="rediss://127.0.0.1:$single/0"
export BQ_TEST_REDIS_TLS_CLUSTER_URL="rediss+cluster://${list%,}"
export BQ_TEST_REDIS_TLS_CA="$dir/ca.crt"
export BQ_TEST_OTHER_CA="$dir/other-ca.crt"
"$@"
