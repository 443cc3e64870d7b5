# Sourced by scripts/with-redis-cluster.sh and scripts/with-redis-tls.sh: the
# ports of a 3-node Redis Cluster on loopback, and forming it.

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# pick_cluster_ports NAME [TAKEN...]: three free ports, none of TAKEN, whose
# cluster bus port (the port + 10000) is free too, into the array NAME.
pick_cluster_ports() {
  local -n picked=$1
  shift
  picked=()
  local p
  while [[ ${#picked[@]} -lt 3 ]]; do
    p=$(free_port)
    (( p + 10000 < 65536 )) || continue
    python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', $p + 10000))" 2>/dev/null || continue
    [[ " ${picked[*]} $* " == *" $p "* ]] && continue
    picked+=("$p")
  done
}

# form_cluster CLI LOG PORT...: joins the running nodes into one cluster (CLI:
# redis-cli, or a function adding its TLS flags; its output in LOG) and waits
# until every node says cluster_state:ok. Fails, printing LOG, otherwise.
form_cluster() {
  local cli=$1 log=$2
  shift 2
  "$cli" --cluster create "${@/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$log" 2>&1 \
    || { cat "$log"; return 1; }
  local ok p
  for _ in $(seq 100); do
    ok=1
    for p in "$@"; do
      "$cli" -p "$p" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
    done
    [[ $ok -eq 1 ]] && return 0
    sleep 0.1
  done
  return 1
}
