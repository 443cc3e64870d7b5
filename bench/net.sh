#!/usr/bin/env bash
# The round-trips bench (crates/stores/benches/round_trips) across a network of
# its own: Redis and PostgreSQL in one network namespace, the bench in another,
# joined by a veth pair (10.233.0.0/30); no traffic leaves the two namespaces.
# The latency is the bench's relay's (a delay line in each direction): this
# kernel has no netem qdisc. Everything is removed on exit, whatever happens.
# Run as root. BQ_BENCH_RTT_US picks the round trips (default 0,500,2000 µs: the
# relay's delay is calibrated to them); BQ_BENCH_DELIVERIES how many per case.
#
# With two cores or more, the servers run on the last core and the bench on the
# others: every connection then pays the same hop between cores. Left to the
# scheduler, a client and the server process answering it shared a core for
# some connections (a round trip of 12 µs here) and not for others (75 µs),
# by chance and for seconds at a time: one client's round trips were 5x
# another's with the same code.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
if [[ $(id -u) -ne 0 ]]; then
  echo "bench/net.sh: network namespaces need root: sudo env \"PATH=\$PATH\" make bench-net" >&2
  exit 1
fi

command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [[ -z $pgbin ]]; then
  apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

# Built outside the namespaces (cargo may need the registry).
bench=$(cargo bench -q -p babelqueue-dedupe-stores --bench round_trips --no-run \
  --message-format=json | python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "round_trips" and m.get("executable"):
        print(m["executable"])')

srv=bq-bench-srv-$$ cli=bq-bench-cli-$$ veth=bqb$$
cores=$(nproc)
if (( cores >= 2 )); then
  on_servers=(taskset -c $((cores - 1))) on_bench=(taskset -c 0-$((cores - 2)))
else
  on_servers=() on_bench=()
fi
dir=$(mktemp -d)
cleanup() {
  ip netns exec "$srv" su postgres -s /bin/sh -c "'$pgbin/pg_ctl' -D '$dir/pg' -m immediate stop" >/dev/null 2>&1 || true
  [[ -f $dir/redis.pid ]] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  ip netns del "$srv" 2>/dev/null || true
  ip netns del "$cli" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
ip netns add "$srv"
ip netns add "$cli"
ip link add "${veth}c" type veth peer name "${veth}s"
ip link set "${veth}c" netns "$cli"
ip link set "${veth}s" netns "$srv"
ip -n "$cli" addr add 10.233.0.1/30 dev "${veth}c"
ip -n "$srv" addr add 10.233.0.2/30 dev "${veth}s"
for ns in "$cli" "$srv"; do ip -n "$ns" link set lo up; done
ip -n "$cli" link set "${veth}c" up
ip -n "$srv" link set "${veth}s" up

ip netns exec "$srv" "${on_servers[@]}" redis-server --bind 10.233.0.2 --port 6379 --protected-mode no --save '' --appendonly no \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --dir "$dir"
chown postgres "$dir"
su postgres -s /bin/sh -c "'$pgbin/initdb' -D '$dir/pg' -A trust -U postgres" >/dev/null
echo "host all all 10.233.0.0/30 trust" >> "$dir/pg/pg_hba.conf"
ip netns exec "$srv" "${on_servers[@]}" su postgres -s /bin/sh -c "'$pgbin/pg_ctl' -D '$dir/pg' -l '$dir/pg.log' -w \
  -o \"-k '$dir' -c listen_addresses=10.233.0.2 -c fsync=off -c shared_preload_libraries=pg_stat_statements\" start" >/dev/null
for _ in $(seq 50); do
  ip netns exec "$cli" redis-cli -h 10.233.0.2 ping >/dev/null 2>&1 && break
  sleep 0.1
done
echo "net: servers in $srv (10.233.0.2${on_servers:+, ${on_servers[*]}}), the bench in $cli (10.233.0.1${on_bench:+, ${on_bench[*]}}); $cores cores, $(uname -r)"

ip netns exec "$cli" "${on_bench[@]}" env \
  BQ_TEST_REDIS_URL=redis://10.233.0.2:6379/0 \
  BQ_TEST_POSTGRES_URL=postgres://postgres@10.233.0.2:5432/postgres \
  BQ_BENCH_RTT_US="${BQ_BENCH_RTT_US:-0,500,2000}" \
  BQ_BENCH_DELIVERIES="${BQ_BENCH_DELIVERIES:-1000}" \
  "$bench"
