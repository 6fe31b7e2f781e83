#!/usr/bin/env bash
# The portable edition against the C++ edition and a hand-written PL/pgSQL claim of the same
# checks (issue #36), side by side on one server (the C++ library not preloaded, so that the
# portable edition may use its settings' names): a new key, a replay, claim + complete.
# The hand-written claim is run twice: as bench/sql/setup.sql has it (pl_claim / pl_complete,
# no argument checks) and with the argument checks both editions make (bench/portable/
# checked.sql), which is the comparison of issue #36. Every workload connects as bench_app,
# a role that is neither a superuser nor the tables' owner, as an application does (so that
# the portable edition's row-level security applies), and owns the preloaded keys. A last
# column: a hand-written claim that makes the portable edition's checks and keeps its promises
# (bench/portable/promised.sql: the settings read, a replay without a lock, no wait on the
# unique index for a claim still open, a lock tag keyed by the role's secret, keys per role by
# row-level security, the owner stamp, bounded values).
# Each workload is run REPS times with pgbench (prepared statements), interleaved, and the
# median tps is printed with the ratios. Results: docs/benchmarks.md, "Portable edition".
#
# The portable edition of BENCH_BEFORE (1.3.3 by default) runs too, in a database of its own,
# interleaved with the rest: before and after under the same load.
#
#   bench/portable.sh      environment: BENCH_SECONDS (5), BENCH_REPS (3), BENCH_CLIENTS (2),
#                          BENCH_BEFORE (a version of portable/tools/generate.sh)
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../test/lib.sh"

SECONDS_PER_RUN="${BENCH_SECONDS:-5}"
REPS="${BENCH_REPS:-3}"
CLIENTS="${BENCH_CLIENTS:-2}"
NKEYS=100000
BEFORE="${BENCH_BEFORE:-1.3.3}"

build_and_install
idem_scratch_init
DIR="$IDEM_SCRATCH/bench-portable"
mkdir -p "$DIR"
idem_is_root && chown postgres: "$DIR"
bash "$HERE/../portable/tools/generate.sh" psql >"$DIR/portable.sql"
bash "$HERE/../portable/tools/generate.sh" psql "$BEFORE" >"$DIR/before.sql"
cp "$HERE"/portable/*.sql "$HERE/sql/setup.sql" "$DIR/"
chmod 644 "$DIR"/*.sql
cluster_start "$DIR/server" "" "shared_preload_libraries = ''" "max_connections = 50" >/dev/null

pg_psql -c "CREATE DATABASE cpp" -c "CREATE DATABASE portable" -c "CREATE DATABASE before" >/dev/null
pg_psql -d cpp -v nkeys=$NKEYS -f "$DIR/setup.sql" >/dev/null
# The same setup in the portable database: the edition made by psql -f instead of CREATE EXTENSION.
sed 's/^CREATE EXTENSION idempotency;$//' "$DIR/setup.sql" | as_pg tee "$DIR/setup-portable.sql" >/dev/null
pg_psql -d portable -f "$DIR/portable.sql" >/dev/null
pg_psql -d portable -v nkeys=$NKEYS -f "$DIR/setup-portable.sql" >/dev/null
pg_psql -d before -f "$DIR/before.sql" >/dev/null
pg_psql -d before -v nkeys=$NKEYS -f "$DIR/setup-portable.sql" >/dev/null
pg_psql -d cpp -f "$DIR/checked.sql" >/dev/null
pg_psql -d cpp -f "$DIR/promised.sql" >/dev/null
# The application role: USAGE on the schema, the hand-written table, the preloaded keys.
pg_psql -c "CREATE ROLE bench_app LOGIN" >/dev/null
for db in cpp portable before; do
  pg_psql -d "$db" -c "GRANT USAGE ON SCHEMA idempotency TO bench_app" \
    -c "UPDATE idempotency.idempotency_keys SET owner = 'bench_app', owner_oid = 'bench_app'::regrole" \
    -c "VACUUM ANALYZE idempotency.idempotency_keys" >/dev/null
done
pg_psql -d cpp -c "GRANT SELECT, INSERT, UPDATE ON pl_keys, plp_keys TO bench_app" \
  -c "GRANT SELECT, INSERT ON plp_secrets TO bench_app" \
  -c "UPDATE pl_keys SET owner = 'bench_app', owner_oid = 'bench_app'::regrole" -c "VACUUM ANALYZE pl_keys" \
  -c "UPDATE plp_keys SET owner = 'bench_app', owner_oid = 'bench_app'::regrole" -c "VACUUM ANALYZE plp_keys" >/dev/null

run() { # DB WORKLOAD -> tps
  as_pg pgbench -n -M prepared -c "$CLIENTS" -j "$CLIENTS" -T "$SECONDS_PER_RUN" -D nkeys=$NKEYS \
    -U bench_app -f "$DIR/$2.sql" "$1" 2>/dev/null | sed -nE 's/^tps = ([0-9.]+).*/\1/p'
}
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

declare -A TPS=()
for workload in new_key replay inbox; do
  declare -a cpp=() portable=() pl=() plc=() plp=() before=()
  for ((r = 1; r <= REPS; r++)); do
    cpp+=("$(run cpp "$workload")")
    portable+=("$(run portable "$workload")")
    before+=("$(run before "$workload")")
    pl+=("$(run cpp "pl_$workload")")
    plc+=("$(run cpp "plc_$workload")")
    plp+=("$(run cpp "plp_$workload")")
  done
  TPS[$workload.cpp]="$(printf '%s\n' "${cpp[@]}" | median)"
  TPS[$workload.portable]="$(printf '%s\n' "${portable[@]}" | median)"
  TPS[$workload.pl]="$(printf '%s\n' "${pl[@]}" | median)"
  TPS[$workload.plc]="$(printf '%s\n' "${plc[@]}" | median)"
  TPS[$workload.plp]="$(printf '%s\n' "${plp[@]}" | median)"
  TPS[$workload.before]="$(printf '%s\n' "${before[@]}" | median)"
done
cluster_stop "$DIR/server"

printf '%s clients as bench_app, %s s per run, median of %s runs (tps)\n\n' "$CLIENTS" "$SECONDS_PER_RUN" "$REPS"
printf '| workload | C++ | portable | hand-written, checked | hand-written, no checks | portable / C++ | portable / hand-written, checked | portable / hand-written, no checks | hand-written, same checks | portable / hand-written, same checks |\n'
printf '|---|---|---|---|---|---|---|---|---|---|\n'
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
for workload in new_key replay inbox; do
  c="${TPS[$workload.cpp]}" p="${TPS[$workload.portable]}" h="${TPS[$workload.pl]}" hc="${TPS[$workload.plc]}"
  hp="${TPS[$workload.plp]}"
  printf '| %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %.0f | %s |\n' "$workload" "$c" "$p" "$hc" "$h" \
    "$(ratio "$p" "$c")" "$(ratio "$p" "$hc")" "$(ratio "$p" "$h")" "$hp" "$(ratio "$p" "$hp")"
done
printf '\nThe portable edition before (%s) in the same run:\n\n' "$BEFORE"
printf '| workload | portable %s | portable now | now / before | %s / hand-written, checked | now / hand-written, checked |\n|---|---|---|---|---|---|\n' "$BEFORE" "$BEFORE"
for workload in new_key replay inbox; do
  b="${TPS[$workload.before]}" p="${TPS[$workload.portable]}" hc="${TPS[$workload.plc]}"
  printf '| %s | %.0f | %.0f | %s | %s | %s |\n' "$workload" "$b" "$p" "$(ratio "$p" "$b")" "$(ratio "$b" "$hc")" "$(ratio "$p" "$hc")"
done
