#!/usr/bin/env bash
# Runs a command with a throwaway 3-node Redis Cluster on loopback, and stops it
# after. The command sees BQ_TEST_REDIS_CLUSTER_URL (a redis+cluster:// spec
# naming every node). Installs redis-server (Debian) if missing.
set -euo pipefail

if ! command -v redis-server >/dev/null; then
  echo "with-redis-cluster: installing redis-server"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
dir=$(mktemp -d)
ports=()
stop() {
  for p in "${ports[@]}"; do
    redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true
  done
  rm -rf "$dir"
}
trap stop EXIT
# A cluster bus port is the node's port + 10000: pick ports whose bus is free too.
while [[ ${#ports[@]} -lt 3 ]]; do
  p=$(free_port)
  (( p + 10000 < 65536 )) || continue
  python3 -c "import socket,sys; s=socket.socket(); s.bind(('127.0.0.1', $p + 10000))" 2>/dev/null || continue
  [[ " ${ports[*]} " == *" $p "* ]] && continue
  ports+=("$p")
done
for p in "${ports[@]}"; do
  mkdir -p "$dir/$p"
  redis-server --bind 127.0.0.1 --port "$p" --cluster-enabled yes \
    --cluster-config-file "$dir/$p/nodes.conf" --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/$p/redis.pid" --logfile "$dir/$p/redis.log" --dir "$dir/$p"
done
for p in "${ports[@]}"; do
  for _ in $(seq 50); do
    redis-cli -p "$p" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
done
redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 \
  || { cat "$dir/create.log"; exit 1; }
for _ in $(seq 100); do
  ok=1
  for p in "${ports[@]}"; do
    redis-cli -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
  done
  [[ $ok -eq 1 ]] && break
  sleep 0.1
done
[[ $ok -eq 1 ]] || { echo "with-redis-cluster: the cluster did not come up"; exit 1; }
echo "with-redis-cluster: 3 nodes, redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on 127.0.0.1:${ports[*]}"

nodes=$(printf '127.0.0.1:%s,' "${ports[@]}")
export BQ_TEST_REDIS_CLUSTER_URL="redis+cluster://${nodes%,}"
"$@"
