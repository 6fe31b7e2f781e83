#!/usr/bin/env bash
# The portable edition against the C++ edition and a hand-written PL/pgSQL claim of the same
# checks (issue #36), side by side on one server (the C++ library not preloaded, so that the
# portable edition may use its settings' names): a new key, a replay, claim + complete.
# Each workload is run REPS times with pgbench (prepared statements), interleaved, and the
# median tps is printed with the ratios. Results: docs/benchmarks.md, "Portable edition".
#
#   bench/portable.sh      environment: BENCH_SECONDS (5), BENCH_REPS (3), BENCH_CLIENTS (2)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../test/lib.sh"

SECONDS_PER_RUN="${BENCH_SECONDS:-5}"
REPS="${BENCH_REPS:-3}"
CLIENTS="${BENCH_CLIENTS:-2}"
NKEYS=100000

build_and_install
idem_scratch_init
DIR="$IDEM_SCRATCH/bench-portable"
mkdir -p "$DIR"
idem_is_root && chown postgres: "$DIR"
bash "$HERE/../portable/tools/generate.sh" psql >"$DIR/portable.sql"
cp "$HERE"/portable/*.sql "$HERE/sql/setup.sql" "$DIR/"
chmod 644 "$DIR"/*.sql
cluster_start "$DIR/server" "" "shared_preload_libraries = ''" "max_connections = 50" >/dev/null

pg_psql -c "CREATE DATABASE cpp" -c "CREATE DATABASE portable" >/dev/null
pg_psql -d cpp -v nkeys=$NKEYS -f "$DIR/setup.sql" >/dev/null
# The same setup in the portable database: the edition made by psql -f instead of CREATE EXTENSION.
sed 's/^CREATE EXTENSION idempotency;$//' "$DIR/setup.sql" | as_pg tee "$DIR/setup-portable.sql" >/dev/null
pg_psql -d portable -f "$DIR/portable.sql" >/dev/null
pg_psql -d portable -v nkeys=$NKEYS -f "$DIR/setup-portable.sql" >/dev/null

run() { # DB WORKLOAD -> tps
  as_pg pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_PER_RUN" -D nkeys=$NKEYS \
    -f "$DIR/$2.sql" "$1" 2>/dev/null | sed -nE 's/^tps = ([0-9.]+).*/\1/p'
}
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

declare -A TPS=()
for workload in new_key replay inbox; do
  declare -a cpp=() portable=() pl=()
  for ((r = 1; r <= REPS; r++)); do
    cpp+=("$(run cpp "$workload")")
    portable+=("$(run portable "$workload")")
    pl+=("$(run cpp "pl_$workload")")
  done
  TPS[$workload.cpp]="$(printf '%s\n' "${cpp[@]}" | median)"
  TPS[$workload.portable]="$(printf '%s\n' "${portable[@]}" | median)"
  TPS[$workload.pl]="$(printf '%s\n' "${pl[@]}" | median)"
done
cluster_stop "$DIR/server"

printf '%s clients, %s s per run, median of %s runs (tps)\n\n' "$CLIENTS" "$SECONDS_PER_RUN" "$REPS"
printf '| workload | C++ | portable | hand-written PL/pgSQL | portable / C++ | portable / hand-written |\n'
printf '|---|---|---|---|---|---|\n'
for workload in new_key replay inbox; do
  c="${TPS[$workload.cpp]}" p="${TPS[$workload.portable]}" h="${TPS[$workload.pl]}"
  printf '| %s | %.0f | %.0f | %.0f | %.2f | %.2f |\n' "$workload" "$c" "$p" "$h" \
    "$(awk -v a="$p" -v b="$c" 'BEGIN {print a / b}')" "$(awk -v a="$p" -v b="$h" 'BEGIN {print a / b}')"
done
