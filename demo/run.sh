#!/usr/bin/env bash
# `make demo`: on a fresh Debian 12 machine (as root) installs the packages it needs,
# builds and installs the extension, starts a throw-away PostgreSQL 15 in demo_cluster/
# as the postgres user, and tells the double-charge story with the real API
# (demo/demo.sql). The server is stopped at the end, also on failure or Ctrl-C.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../test/lib.sh"

ensure_packages
build_and_install

dir="$IDEM_ROOT/demo_cluster"
if ! idem_pg_can_reach "$IDEM_ROOT"; then
  # postgres cannot enter the project directory (say, under /root): use /tmp.
  dir="/tmp/idempotency-demo-cluster"
fi
idem_log "Starting a throw-away PostgreSQL 15 in $dir ..."
mkdir -p "$dir"
# A server as users have it: its search_path does not name the extension's schema (the
# test servers' does; see test/lib.sh).
cluster_start "$dir" "" "log_min_messages = warning" "search_path = '\"\$user\", public'" ||
  idem_die "could not start the demo server"
# The demo script is read from the cluster dir, which postgres can read.
cp "$IDEM_ROOT/demo/demo.sql" "$dir/demo.sql"
idem_is_root && chown postgres: "$dir/demo.sql"

IDEM_SCRATCH="$dir" pg_psql -d postgres -c 'CREATE DATABASE demo'
export PGDATABASE=demo
IDEM_SCRATCH="$dir" pg_psql -c 'CREATE EXTENSION idempotency'
IDEM_SCRATCH="$dir" pg_psql -f "$dir/demo.sql"

cluster_stop "$dir"
idem_log "Done; the server is stopped (its files stay in $dir until the next run)."
