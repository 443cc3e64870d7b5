#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL cluster on loopback, and stops it
# after. The command sees BQ_TEST_POSTGRES_URL. The server also speaks TLS, its
# certificate signed by a CA made here (scripts/test-ca.sh; the CA's PEM file in
# BQ_TEST_POSTGRES_TLS_CA), and listens on 127.0.0.2 too (a name the certificate
# does not hold). PgBouncer in transaction mode in front of it (BQ_TEST_PGBOUNCER_URL;
# BQ_TEST_PGBOUNCER_IGNORING_URL: one that ignores `options`). Installs Debian's
# postgresql and pgbouncer if missing. pg_stat_statements is loaded (the benchmark counts statements with
# it). Run as root (the server runs as the postgres user) or as a user who
# can run initdb itself.
set -euo pipefail

bin=""
find_bin() { bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true); }
find_bin
SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
if [[ -z $bin || ! -x $bin/initdb ]]; then
  echo "with-postgres: installing postgresql"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq postgresql >/dev/null
  find_bin
fi
if ! command -v pgbouncer >/dev/null && [[ ! -x /usr/sbin/pgbouncer ]]; then
  echo "with-postgres: installing pgbouncer"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq pgbouncer >/dev/null
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
port=$(free_port)
dir=$(mktemp -d)
as_pg() { if [[ $(id -u) -eq 0 ]]; then su postgres -s /bin/sh -c "$1"; else sh -c "$1"; fi; }
if [[ $(id -u) -eq 0 ]]; then chown postgres "$dir"; fi
chmod 700 "$dir"
"$(dirname "$0")/test-ca.sh" "$dir/tls"
if [[ $(id -u) -eq 0 ]]; then chown -R postgres "$dir/tls"; fi
stop() {
  for pid in "$dir"/pgbouncer*.pid; do [[ -f $pid ]] && kill "$(cat "$pid")" 2>/dev/null; done || true
  as_pg "'$bin/pg_ctl' -D '$dir/data' -m immediate stop" >/dev/null 2>&1 || true
  as_pg "'$bin/pg_ctl' -D '$dir/crashable' -m immediate stop" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT
as_pg "'$bin/initdb' -D '$dir/data' -A trust -U postgres" >/dev/null
as_pg "'$bin/pg_ctl' -D '$dir/data' -l '$dir/log' -w \
  -o \"-p $port -k '$dir' -c listen_addresses=127.0.0.1,127.0.0.2 -c ssl=on -c ssl_cert_file='$dir/tls/server.crt' -c ssl_key_file='$dir/tls/server.key' -c max_connections=300 -c fsync=off -c shared_preload_libraries=pg_stat_statements\" start" >/dev/null
echo "with-postgres: $("$bin/postgres" --version) on 127.0.0.1:$port"

export BQ_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"

# PgBouncer in front, in transaction mode with a few server connections (so
# calls of different clients share them), as Debian ships it; a second one that
# ignores the startup parameter `options` (as many setups do for JDBC's).
pgbouncer_bin=$(command -v pgbouncer || echo /usr/sbin/pgbouncer)
bouncer() { # NAME EXTRA-SETTING [SERVER-PORT]: starts one, prints its port
  local name=$1 extra=$2 server=${3:-$port} listen
  listen=$(free_port)
  cat >"$dir/$name.ini" <<INI
[databases]
postgres = host=127.0.0.1 port=$server dbname=postgres user=postgres
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $listen
unix_socket_dir =
auth_type = trust
auth_file = $dir/pgbouncer.users
pool_mode = transaction
default_pool_size = 4
max_client_conn = 500
logfile = $dir/$name.log
pidfile = $dir/$name.pid
$extra
INI
  if [[ $(id -u) -eq 0 ]]; then chown postgres "$dir/$name.ini"; fi
  as_pg "'$pgbouncer_bin' -d '$dir/$name.ini'"
  for _ in $(seq 50); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $listen), 0.2)" 2>/dev/null && break
    sleep 0.1
  done
  echo "$listen"
}
echo '"postgres" ""' >"$dir/pgbouncer.users"
if [[ $(id -u) -eq 0 ]]; then chown postgres "$dir/pgbouncer.users"; fi
strict=$(bouncer pgbouncer "")
ignoring=$(bouncer pgbouncer-ignoring "ignore_startup_parameters = options")
echo "with-postgres: $("$pgbouncer_bin" --version | head -n 1) (transaction mode) on 127.0.0.1:$strict, and ignoring \`options\` on 127.0.0.1:$ignoring"
export BQ_TEST_PGBOUNCER_URL="postgres://postgres@127.0.0.1:$strict/postgres"
export BQ_TEST_PGBOUNCER_IGNORING_URL="postgres://postgres@127.0.0.1:$ignoring/postgres"
export BQ_TEST_POSTGRES_TLS_CA="$dir/tls/ca.crt"
export BQ_TEST_OTHER_CA="$dir/tls/other-ca.crt"

# A second cluster the tests crash and restart, for what a crash does that a
# lost session does not (a transaction id whose writes never reached the disk
# is handed out again): BQ_TEST_POSTGRES_CRASH stop|start, or kill PID (one
# backend killed, as the OOM killer does: the server resets every session and
# recovers, without a restart); BQ_TEST_PGBOUNCER_CRASHABLE_URL in front of it.
# Its WAL writer waits 10 s, so what a crash loses is not down to a 200 ms race.
crashable=$(free_port)
as_pg "'$bin/initdb' -D '$dir/crashable' -A trust -U postgres" >/dev/null
cat >"$dir/crash.sh" <<SH
#!/usr/bin/env bash
# stop: as a crash does (immediate); start: recovers and waits until it is up.
case "\$1" in
  stop) mode="-m immediate stop" ;;
  start) mode="-w -l '$dir/crashable.log' -o \"-p $crashable -k '$dir' -c listen_addresses=127.0.0.1 -c wal_writer_delay=10000\" start" ;;
  kill) mode="" ;;
  *) echo "usage: crash.sh stop|start|kill PID" >&2; exit 2 ;;
esac
$(declare -f as_pg)
if [[ \$1 == kill ]]; then as_pg "kill -9 \$2"; exit; fi
as_pg "'$bin/pg_ctl' -D '$dir/crashable' \$mode" >/dev/null
SH
chmod +x "$dir/crash.sh"
"$dir/crash.sh" start
export BQ_TEST_POSTGRES_CRASHABLE_URL="postgres://postgres@127.0.0.1:$crashable/postgres"
# PgBouncer in front of it too (a session goes on across a crash); it tries
# the server again after a second, not fifteen.
crash_bouncer=$(bouncer pgbouncer-crashable "server_login_retry = 1" "$crashable")
export BQ_TEST_PGBOUNCER_CRASHABLE_URL="postgres://postgres@127.0.0.1:$crash_bouncer/postgres"
export BQ_TEST_POSTGRES_CRASH="$dir/crash.sh"
"$@"
