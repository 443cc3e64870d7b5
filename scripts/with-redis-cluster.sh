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

source "$(dirname "$0")/redis-cluster-lib.sh"
dir=$(mktemp -d)
ports=()
stop() {
  for p in "${ports[@]}"; do
    redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true
  done
  rm -rf "$dir"
}
trap stop EXIT
pick_cluster_ports ports
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
form_cluster redis-cli "$dir/create.log" "${ports[@]}" \
  || { echo "with-redis-cluster: the cluster did not come up"; exit 1; }
echo "with-redis-cluster: 3 nodes, redis-server $(redis-server --version | grep -o 'v=[0-9.]*') on 127.0.0.1:${ports[*]}"

nodes=$(printf '127.0.0.1:%s,' "${ports[@]}")
export BQ_TEST_REDIS_CLUSTER_URL="redis+cluster://${nodes%,}"
"$@"
