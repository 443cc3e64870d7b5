#!/usr/bin/env bash
# Makes a throwaway CA and a server certificate it signs, for the TLS test
# servers: DIR/ca.crt, DIR/server.crt, DIR/server.key, and DIR/other-ca.crt (a
# CA that signed nothing here: the wrong CA to trust). The certificate names
# 127.0.0.1 and localhost only (a test connecting to 127.0.0.2 meets a name the
# certificate does not hold). Installs openssl if missing.
set -euo pipefail
dir=${1:?usage: test-ca.sh DIR}
if ! command -v openssl >/dev/null; then
  SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq openssl >/dev/null
fi
mkdir -p "$dir"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=bq-dedupe test CA" \
  -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=bq-dedupe other CA" \
  -keyout "$dir/other-ca.key" -out "$dir/other-ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
  -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$dir/san.ext"
openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
  -days 2 -extfile "$dir/san.ext" -out "$dir/server.crt" 2>/dev/null
chmod 600 "$dir/server.key"
