#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The benchmark suite (make bench). Sets up its own throw-away server, runs every
# competitor side by side with pgbench, and prints throughput, p50/p99 latency and the
# ratios the goals are stated in. Only ratios within one run mean anything.
#
#   bench/run.sh [PART...]     PART: claims uuid wal memory instructions (default: all five)
#                              (instructions: CPU instructions per transaction counted by
#                              callgrind, which other load on the machine does not disturb)
#                              scale    the scale curve (long; not part of the default)
#                              profile  perf profile of the claim path (not in the default)
#   QUICK=1 bench/run.sh       a short run (~3 minutes): fewer seconds, smaller counts
#
# Environment: BENCH_PORT (5460), BENCH_SECONDS / BENCH_REPS (per pgbench run),
# BENCH_CLIENTS (8), BENCH_THREADS (2), BENCH_NO_BUILD=1 (use the installed extension),
# SCALE_STEPS ("1 10": millions of keys for the scale curve).
# Results: bench/results/latest/ (or BENCH_OUT): summary.txt, the raw TSVs and the charts
# (throughput.png, scale.png) of the last run; a copy of each summary stays in
# bench/results/summary-<time>.txt.
set -euo pipefail

BENCH_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$BENCH_HERE/../test/lib.sh"

QUICK="${QUICK:-0}"
PORT="${BENCH_PORT:-5460}"
CLIENTS="${BENCH_CLIENTS:-8}"
THREADS="${BENCH_THREADS:-2}"
NKEYS=100000
if [[ $QUICK == 1 ]]; then
  SECONDS_PER_RUN="${BENCH_SECONDS:-1}"
  REPS="${BENCH_REPS:-3}"
  UUID_COUNT=1000000
  UUID_INSERTS=1000000
  MEMORY_CALLS="${BENCH_MEMORY_CALLS:-300000}"
  WAL_TX=2000
  CALLGRIND_RUNS="50 300"
else
  SECONDS_PER_RUN="${BENCH_SECONDS:-3}"
  REPS="${BENCH_REPS:-3}"
  UUID_COUNT=5000000
  UUID_INSERTS=3000000
  MEMORY_CALLS="${BENCH_MEMORY_CALLS:-10000000}"
  WAL_TX=10000
  CALLGRIND_RUNS="100 600"
fi

PARTS=("$@")
((${#PARTS[@]})) || PARTS=(claims uuid wal memory instructions)
for part in "${PARTS[@]}"; do
  case $part in
    claims | uuid | wal | memory | instructions | scale | profile) ;;
    *) idem_die "unknown part '$part' (claims uuid wal memory instructions scale profile)" ;;
  esac
done

RESULTS="$BENCH_HERE/results"
OUT="${BENCH_OUT:-$RESULTS/latest}"
mkdir -p "$RESULTS"
rm -rf "$OUT"
mkdir -p "$OUT"

# pgbench comes with the server packages; callgrind and perf for the parts that use them.
IDEM_PACKAGES+=(python3 python3-matplotlib valgrind)
[[ " ${PARTS[*]} " == *" profile "* ]] && IDEM_PACKAGES+=(linux-perf)
ensure_packages
if [[ ${BENCH_NO_BUILD:-0} != 1 ]]; then build_and_install; fi

# Scratch (cluster, pgbench logs) owned by postgres under bench/results/.
IDEM_SCRATCH="$RESULTS/scratch-$$"
mkdir -p "$IDEM_SCRATCH"
idem_is_root && chown -R postgres: "$RESULTS/scratch-$$"
export IDEM_SCRATCH
idem_scratch_init
# Leftovers of runs that were killed.
for old in "$RESULTS"/scratch-*; do
  [[ -d $old && $old != "$IDEM_SCRATCH" ]] || continue
  kill -0 "${old##*/scratch-}" 2>/dev/null && continue
  idem_stop_servers_under "$old"
  rm -rf "$old"
done

# Durable by default (fsync on): synchronous_commit = on then pays a real WAL flush.
# The workloads call the extension's functions (schema idempotency) unqualified.
# Checkpoints and autovacuum are kept out of the measured runs (checkpoints only where a
# part asks for one), so that no competitor pays for another's writes.
cluster_start "$IDEM_SCRATCH/cluster" "$PORT" \
  "fsync = on" \
  "synchronous_commit = on" \
  "shared_buffers = 128MB" \
  "max_wal_size = 16GB" \
  "checkpoint_timeout = 1h" \
  "autovacuum = off" \
  "max_connections = 40" \
  "log_min_messages = warning" \
  "search_path = '\"\$user\", public, idempotency'"

# perf resolves our symbols through its build-id cache even when a later `make install`
# replaces the library file the server has mapped.
if command -v perf >/dev/null; then
  perf buildid-cache -a "$("$IDEM_PG_CONFIG" --pkglibdir)/idempotency.so" >/dev/null 2>&1 || true
fi

psql_q() { pg_psql -At "$@"; }

summary() { printf '%s\n' "$*" | tee -a "$OUT/summary.txt"; }

machine_line() {
  printf '%s cores, %s, %s' "$(nproc)" \
    "$(psql_q -c "SELECT split_part(version(), ' ', 2)" | sed 's/^/PostgreSQL /')" \
    "$(date -u '+%Y-%m-%d %H:%M UTC')"
}

summary "idempotency benchmark: $(machine_line); pgbench -M prepared, $CLIENTS clients, $THREADS threads, ${REPS} x ${SECONDS_PER_RUN}s per workload (medians)$([[ $QUICK == 1 ]] && echo ', QUICK')"
idem_log "setting up the benchmark database ..."
pg_psql -v nkeys="$NKEYS" -f "$BENCH_HERE/sql/setup.sql" >/dev/null

# ---------------------------------------------------------------------------------------
# claims: every competitor side by side, repetitions interleaved (round-robin) so that
# noise from other processes on the machine spreads over all of them.
# ---------------------------------------------------------------------------------------

# name:synchronous_commit settings. Read-only workloads commit nothing, so they run once.
# shellcheck disable=SC2054 # the commas are part of each item
WORKLOADS=(
  floor_v7:on,off floor_rand:on,off claim_v7:on,off claim_rand:on,off pl_claim_v7:on,off
  inbox:on,off pl_inbox:on,off inbox_tx:on,off pl_inbox_tx:on,off
  pk_select:on replay:on mismatch:on in_progress:on pl_replay:on,off
)

# pgbench_run NAME SYNC REP: one pgbench run; appends "name sync rep tps p50 p99 failed".
pgbench_run() {
  local name="$1" sync="$2" rep="$3" dir="$IDEM_SCRATCH/logs/$1-$2-$3" out
  as_pg mkdir -p "$dir"
  out="$(as_pg env PGOPTIONS="-c synchronous_commit=$sync" pgbench -n -M prepared \
    -c "$CLIENTS" -j "$THREADS" -T "$SECONDS_PER_RUN" -D nkeys="$NKEYS" \
    -f "$BENCH_HERE/workloads/$name.sql" -l --log-prefix="$dir/tx" --sampling-rate=0.25 2>&1)" ||
    { printf '%s\n' "$out" >&2; idem_die "pgbench failed: $name (synchronous_commit=$sync)"; }
  printf '%s\n' "$out" >"$dir/pgbench.out"
  local tps failed
  tps="$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | tail -1)"
  failed="$(sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p' <<<"$out")"
  python3 "$BENCH_HERE/report.py" latency "$name" "$sync" "$rep" "$tps" "${failed:-0}" "$dir"/tx.* \
    >>"$OUT/claims.tsv"
}

run_claims() {
  idem_log "claims: ${#WORKLOADS[@]} workloads x $REPS repetitions x ${SECONDS_PER_RUN}s ..."
  : >"$OUT/claims.tsv"
  local rep item name syncs sync
  for ((rep = 1; rep <= REPS; rep++)); do
    for item in "${WORKLOADS[@]}"; do
      name="${item%%:*}"
      syncs="${item#*:}"
      for sync in ${syncs//,/ }; do
        pgbench_run "$name" "$sync" "$rep"
      done
    done
    idem_log "  repetition $rep done"
  done
  # Did every workload get the answer it is meant to measure?
  psql_q -F ' ' -c "SELECT 'rows', (SELECT count(*) FROM idempotency_keys),
                            (SELECT count(*) FROM floor_keys), (SELECT count(*) FROM pl_keys)" \
    >"$OUT/claims-rows.txt"
  psql_q -c "SELECT status, count(*) FROM idempotency_keys GROUP BY 1 ORDER BY 1" >>"$OUT/claims-rows.txt"
  python3 "$BENCH_HERE/report.py" claims "$OUT/claims.tsv"
  echo
  psql_q -c "SELECT 'Answers counted by idempotency_stats during the runs: claimed ' || claimed ||
                    ', replayed ' || replayed || ', mismatched ' || mismatched || ', in_progress ' ||
                    in_progress || ', completed ' || completed || ', reclaimed ' || reclaimed
               FROM idempotency_stats WHERE datname = current_database()" || true
}

# ---------------------------------------------------------------------------------------
# uuid: gen_uuid_v7() against gen_random_uuid()
# ---------------------------------------------------------------------------------------

# Seconds an SQL statement takes inside the server (no client transfer).
timed_sql() {
  psql_q -c "DO \$\$ DECLARE t timestamptz := clock_timestamp(); BEGIN
               EXECUTE \$q\$$1\$q\$;
               RAISE NOTICE 'elapsed %', extract(epoch FROM clock_timestamp() - t); END \$\$" 2>&1 |
    sed -n 's/.*elapsed \([0-9.]*\).*/\1/p'
}

run_uuid() {
  idem_log "uuid: count() of $UUID_COUNT values, $UUID_INSERTS primary-key inserts ..."
  : >"$OUT/uuid.tsv"
  local rep fn
  for ((rep = 1; rep <= 3; rep++)); do
    for fn in gen_uuid_v7 gen_random_uuid; do
      printf 'generate\t%s\t%s\t%s\n' "$fn" "$rep" \
        "$(timed_sql "SELECT count($fn()) FROM generate_series(1, $UUID_COUNT)")" >>"$OUT/uuid.tsv"
    done
  done
  # Primary-key inserts in one statement each, from a checkpointed start; tables dropped
  # afterwards. Alternated twice so that neither always runs on a warmer server.
  for rep in 1 2; do
    for fn in gen_uuid_v7 gen_random_uuid; do
      psql_q -c "DROP TABLE IF EXISTS uuid_$fn; CREATE TABLE uuid_$fn (id uuid PRIMARY KEY, n int); CHECKPOINT" >/dev/null
      local secs size
      secs="$(timed_sql "INSERT INTO uuid_$fn SELECT $fn(), n FROM generate_series(1, $UUID_INSERTS) n")"
      size="$(psql_q -c "SELECT pg_relation_size('uuid_${fn}_pkey')")"
      printf 'insert\t%s\t%s\t%s\t%s\n' "$fn" "$rep" "$secs" "$size" >>"$OUT/uuid.tsv"
      psql_q -c "DROP TABLE uuid_$fn" >/dev/null
    done
  done
  python3 "$BENCH_HERE/report.py" uuid "$OUT/uuid.tsv" "$UUID_COUNT" "$UUID_INSERTS"
}

# ---------------------------------------------------------------------------------------
# wal: WAL bytes per transaction, from pg_current_wal_lsn() differences
# ---------------------------------------------------------------------------------------

# wal_of WORKLOAD: runs WAL_TX transactions on one connection twice: right after a
# CHECKPOINT (full-page images of every page touched first) and then again (steady state:
# images only for pages new since the checkpoint). Prints "with_fpi steady" bytes/tx.
wal_of() {
  local name="$1" a b c
  psql_q -c "CHECKPOINT" >/dev/null
  a="$(psql_q -c "SELECT pg_current_wal_lsn()")"
  as_pg pgbench -n -M prepared -c 1 -t "$WAL_TX" -D nkeys="$NKEYS" -f "$BENCH_HERE/workloads/$name.sql" >/dev/null
  b="$(psql_q -c "SELECT pg_current_wal_lsn()")"
  as_pg pgbench -n -M prepared -c 1 -t "$WAL_TX" -D nkeys="$NKEYS" -f "$BENCH_HERE/workloads/$name.sql" >/dev/null
  c="$(psql_q -c "SELECT pg_current_wal_lsn()")"
  psql_q -c "SELECT pg_wal_lsn_diff('$b', '$a') / $WAL_TX, pg_wal_lsn_diff('$c', '$b') / $WAL_TX" -F $'\t'
}

run_wal() {
  idem_log "wal: $WAL_TX transactions per workload ..."
  : >"$OUT/wal.tsv"
  local name
  for name in floor_v7 claim_v7 inbox inbox_tx pl_inbox pl_replay replay; do
    printf '%s\t%s\n' "$name" "$(wal_of "$name")" >>"$OUT/wal.tsv"
  done
  python3 "$BENCH_HERE/report.py" wal "$OUT/wal.tsv"
}

# ---------------------------------------------------------------------------------------
# memory: one backend's memory before and after MEMORY_CALLS calls
# ---------------------------------------------------------------------------------------

# One psql session = one backend: a warm-up, a snapshot, MEMORY_CALLS calls of every kind
# (per iteration: claim + complete of a new key, 3 replays, 3 in_progress, 2 mismatches; a
# COMMIT every 500 iterations), a snapshot half-way and at the end. Compares the backend's
# memory contexts (pg_backend_memory_contexts) and its private memory (RssAnon).
run_memory() {
  idem_log "memory: $MEMORY_CALLS calls in one backend ..."
  local iterations=$((MEMORY_CALLS / 10)) warmup=$((MEMORY_CALLS / 100))
  # At least two commits' worth of warm-up: the lock manager's local table grows to the
  # 500 key locks a transaction of this loop holds.
  ((warmup >= 1000)) || warmup=1000
  pg_psql -At -F $'\t' -v iterations="$iterations" -v warmup="$warmup" -v nkeys="$NKEYS" \
    -f "$BENCH_HERE/sql/memory.sql" >"$OUT/memory.tsv"
  python3 "$BENCH_HERE/report.py" memory "$OUT/memory.tsv" "$MEMORY_CALLS"
}

# ---------------------------------------------------------------------------------------
# scale: claim throughput and sizes as the table grows
# ---------------------------------------------------------------------------------------

# ---------------------------------------------------------------------------------------
# instructions: CPU instructions per transaction inside the server (valgrind callgrind on
# a single-user backend), which other work on the machine does not disturb. The server is
# stopped for this part and started again afterwards.
# ---------------------------------------------------------------------------------------

# instructions_of N PREFIX STATEMENT: total instructions of a single-user backend that
# prepares STATEMENT and executes it N times.
instructions_of() {
  local n="$1" prefix="$2" statement="$3" file="$IDEM_SCRATCH/instructions.sql" out i
  out="$IDEM_SCRATCH/callgrind.out"
  {
    if [[ -n $prefix ]]; then
      echo "PREPARE p(text) AS $statement;"
      for ((i = 0; i < n; i++)); do echo "EXECUTE p('$prefix$((RANDOM * 32768 % NKEYS + RANDOM % NKEYS % 3 + 1))');"; done
    elif [[ $statement == *' ;; '* ]]; then
      # Two statements, one transaction: a line of two statements is one implicit transaction.
      echo "PREPARE p AS ${statement%% ;; *};"
      echo "PREPARE q AS ${statement#* ;; };"
      for ((i = 0; i < n; i++)); do echo "EXECUTE p; EXECUTE q;"; done
    else
      echo "PREPARE p AS $statement;"
      for ((i = 0; i < n; i++)); do echo "EXECUTE p;"; done
    fi
  } | as_pg tee "$file" >/dev/null
  as_pg valgrind --tool=callgrind --callgrind-out-file="$out" \
    postgres --single -D "$IDEM_SCRATCH/cluster/data" -c synchronous_commit=off postgres \
    <"$file" >"$IDEM_SCRATCH/instructions.log" 2>&1 ||
    { tail -5 "$IDEM_SCRATCH/instructions.log" >&2; idem_die "single-user backend failed"; }
  if grep -q ERROR "$IDEM_SCRATCH/instructions.log"; then
    grep -m3 ERROR "$IDEM_SCRATCH/instructions.log" >&2
    idem_die "a statement failed in the instruction count"
  fi
  sed -n 's/^summary: \([0-9]*\)/\1/p' "$out"
}

run_instructions() {
  command -v valgrind >/dev/null || { echo "instructions: valgrind is missing (apt-get install valgrind)"; return 0; }
  idem_log "instructions: callgrind on a single-user backend (server stopped meanwhile) ..."
  local env_before
  env_before="$(declare -p PGHOST PGPORT PGUSER PGDATABASE)"
  cluster_stop "$IDEM_SCRATCH/cluster"
  : >"$OUT/instructions.tsv"
  local name prefix statement small large
  while IFS='|' read -r name prefix statement; do
    [[ -z $name || $name == \#* ]] && continue
    # The difference of two runs removes start-up and shutdown.
    local -a runs
    read -ra runs <<<"$CALLGRIND_RUNS"
    small="$(instructions_of "${runs[0]}" "$prefix" "$statement")"
    large="$(instructions_of "${runs[1]}" "$prefix" "$statement")"
    printf '%s\t%s\n' "$name" "$(((large - small) / (runs[1] - runs[0])))" >>"$OUT/instructions.tsv"
  done <"$BENCH_HERE/sql/instructions.txt"
  # The same server again, for the parts that follow.
  as_pg pg_ctl -D "$IDEM_SCRATCH/cluster/data" -l "$IDEM_SCRATCH/cluster/server.log" -w -t 60 start \
    >/dev/null || idem_die "the server did not start again"
  eval "$env_before"
  export PGHOST PGPORT PGUSER PGDATABASE
  python3 "$BENCH_HERE/report.py" instructions "$OUT/instructions.tsv"
}

source "$BENCH_HERE/scale.sh"

# ---------------------------------------------------------------------------------------
# profile: where the time of a claim goes
# ---------------------------------------------------------------------------------------

source "$BENCH_HERE/profile.sh"

for part in "${PARTS[@]}"; do
  summary ""
  "run_$part" | tee -a "$OUT/summary.txt"
done
# Charts of this run, titled with the run they show (its summary line and commit); Debian's
# python3, which has python3-matplotlib.
run_label="$(head -1 "$OUT/summary.txt" | sed 's/^idempotency benchmark: //; s/;.*//')"
commit="$(git -C "$IDEM_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$IDEM_ROOT" diff --quiet HEAD -- src 2>/dev/null || commit="$commit with local changes"
/usr/bin/python3 "$BENCH_HERE/report.py" charts "$OUT" "make bench of $run_label, commit $commit" \
  "$OUT/claims.tsv" "$OUT/scale.tsv" | tee -a "$OUT/summary.txt"
cp "$OUT/summary.txt" "$RESULTS/summary-$(date -u +%Y%m%dT%H%M%S).txt"
idem_log "summary: $OUT/summary.txt"
