#!/usr/bin/env bash
# Runs a command with a throwaway PostgreSQL cluster on loopback, and stops it
# after. The command sees BQ_TEST_POSTGRES_URL. The server also speaks TLS, its
# certificate signed by a CA made here (scripts/test-ca.sh; the CA's PEM file in
# BQ_TEST_POSTGRES_TLS_CA), and listens on 127.0.0.2 too (a name the certificate
# does not hold). Installs Debian's postgresql if missing. pg_stat_statements is loaded (the benchmark counts statements with
# it). Run as root (the server runs as the postgres user) or as a user who
# can run initdb itself.
set -euo pipefail

bin=""
find_bin() { bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true); }
find_bin
if [[ -z $bin || ! -x $bin/initdb ]]; then
  echo "with-postgres: installing postgresql"
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq postgresql >/dev/null
  find_bin
fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
dir=$(mktemp -d)
as_pg() { if [[ $(id -u) -eq 0 ]]; then su postgres -s /bin/sh -c "$1"; else sh -c "$1"; fi; }
if [[ $(id -u) -eq 0 ]]; then chown postgres "$dir"; fi
chmod 700 "$dir"
"$(dirname "$0")/test-ca.sh" "$dir/tls"
if [[ $(id -u) -eq 0 ]]; then chown -R postgres "$dir/tls"; fi
stop() {
  as_pg "'$bin/pg_ctl' -D '$dir/data' -m immediate stop" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT
as_pg "'$bin/initdb' -D '$dir/data' -A trust -U postgres" >/dev/null
as_pg "'$bin/pg_ctl' -D '$dir/data' -l '$dir/log' -w \
  -o \"-p $port -k '$dir' -c listen_addresses=127.0.0.1,127.0.0.2 -c ssl=on -c ssl_cert_file='$dir/tls/server.crt' -c ssl_key_file='$dir/tls/server.key' -c max_connections=300 -c fsync=off -c shared_preload_libraries=pg_stat_statements\" start" >/dev/null
echo "with-postgres: $("$bin/postgres" --version) on 127.0.0.1:$port"

export BQ_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$port/postgres"
export BQ_TEST_POSTGRES_TLS_CA="$dir/tls/ca.crt"
export BQ_TEST_OTHER_CA="$dir/tls/other-ca.crt"
"$@"
