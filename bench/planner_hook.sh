#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# What a query that never calls the extension pays for its planner hook (src/result_scan.cpp,
# installed when the library is loaded): CPU instructions per statement (valgrind callgrind
# on a single-user backend, as bench/run.sh instructions counts them) of queries with a
# function in FROM that is not ours, with the library preloaded and without it. Each
# statement is sent as it is, not prepared, so that every execution is planned.
#
#   bench/planner_hook.sh                 build, install, print the table
#   BENCH_NO_BUILD=1 bench/planner_hook.sh   use the installed extension
#
# Environment: PG_CONFIG (as test/run.sh), PLANNER_RUNS ("100 600": the difference of the
# two runs, divided by 500, removes start-up and shutdown).
set -euo pipefail

BENCH_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$BENCH_HERE/../test/lib.sh"

IDEM_PACKAGES+=(valgrind)
ensure_packages
if [[ ${BENCH_NO_BUILD:-0} != 1 ]]; then build_and_install; fi

IDEM_SCRATCH="$(mktemp -d /tmp/idem-planner-hook.XXXXXX)"
idem_is_root && chown postgres: "$IDEM_SCRATCH"
export IDEM_SCRATCH
idem_scratch_init
cluster_start "$IDEM_SCRATCH/cluster"
# The extension installed (its functions in pg_proc), and another extension's function.
pg_psql -q -c "CREATE EXTENSION idempotency" -c "CREATE EXTENSION pgcrypto" >/dev/null
cluster_stop "$IDEM_SCRATCH/cluster"

# instructions_of N PRELOAD STATEMENT: total instructions of a single-user backend that runs
# STATEMENT N times, with shared_preload_libraries = PRELOAD.
instructions_of() {
  local n="$1" preload="$2" statement="$3" file="$IDEM_SCRATCH/statements.sql" i
  local out="$IDEM_SCRATCH/callgrind.out"
  for ((i = 0; i < n; i++)); do echo "$statement;"; done | as_pg tee "$file" >/dev/null
  as_pg valgrind --tool=callgrind --callgrind-out-file="$out" \
    postgres --single -D "$IDEM_SCRATCH/cluster/data" -c shared_preload_libraries="$preload" \
    postgres <"$file" >"$IDEM_SCRATCH/single.log" 2>&1 ||
    { tail -5 "$IDEM_SCRATCH/single.log" >&2; idem_die "single-user backend failed"; }
  if grep -q ERROR "$IDEM_SCRATCH/single.log"; then
    grep -m3 ERROR "$IDEM_SCRATCH/single.log" >&2
    idem_die "a statement failed"
  fi
  sed -n 's/^summary: \([0-9]*\)/\1/p' "$out"
}

read -ra runs <<<"${PLANNER_RUNS:-100 600}"
statements=(
  "SELECT * FROM generate_series(1, 3)"
  "SELECT * FROM digest('abc'::text, 'sha256')"
  "SELECT * FROM generate_series(1, 3) g, LATERAL digest(g::text, 'sha256') d"
)
printf '%s\n' "| statement | not loaded | preloaded | difference |" "|---|---:|---:|---:|"
for statement in "${statements[@]}"; do
  declare -A per=()
  for preload in "" idempotency; do
    small="$(instructions_of "${runs[0]}" "$preload" "$statement")"
    large="$(instructions_of "${runs[1]}" "$preload" "$statement")"
    per[${preload:-none}]=$(((large - small) / (runs[1] - runs[0])))
  done
  printf '| `%s` | %d | %d | %+d |\n' "$statement" "${per[none]}" "${per[idempotency]}" \
    "$((per[idempotency] - per[none]))"
done
rm -rf "$IDEM_SCRATCH"
