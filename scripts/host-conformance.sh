#!/usr/bin/env bash
# `bq-dedupe conformance` through the component against each store: memory, a
# fresh SQLite file, and the Redis in $BQ_TEST_REDIS_URL (see with-redis.sh).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$root/target/debug/bq-dedupe"
db="$(mktemp -d)/seen.db"
trap 'rm -rf "$(dirname "$db")"' EXIT
: "${BQ_TEST_REDIS_URL:?run me under scripts/with-redis.sh}"
for store in memory "sqlite:$db" "$BQ_TEST_REDIS_URL?prefix=bq-conformance:"; do
  echo "== bq-dedupe conformance --store ${store%%\?*}"
  "$bin" conformance --store "$store"
done
