#!/usr/bin/env bash
# The cleanup benchmark (issue 4), on a throw-away server:
#
#   1. deletion rate in rows/s on N expired keys (default 1M), three ways in the same run,
#      each from the same freshly loaded and vacuumed table:
#        worker     the background worker's round (triggered by a reload to a 100 ms
#                   interval; timed from the reload to the end of the round it records)
#        function   SELECT idempotency_cleanup()  (batches of 5000, each committed in the
#                   function's own background worker)
#        reference  a hand-written loop: DELETE ... USING (SELECT ctid ... LIMIT 5000
#                   FOR UPDATE SKIP LOCKED), COMMIT per batch (bench/cleanup/setup.sql)
#   2. claim_key latency (pgbench -M prepared, new keys) with 3N expired keys in the table:
#      p50 / p99 while no cleanup runs and while the worker deletes them, in alternating
#      windows (CLEANUP_REPS of each), pooled.
#
# Prints the numbers and the ratios (worker / reference, p99 during / p99 without). A
# benchmark reports; it asserts nothing. Goals: >= 150k rows/s, p99 ratio <= 1.5.
#
# Environment: CLEANUP_ROWS (1000000), CLEANUP_LATENCY_SECONDS (3), CLEANUP_REPS (3),
# CLEANUP_CLIENTS (4),
# CLEANUP_PORT (5451), BENCH_NO_BUILD=1 (use the installed extension),
# CLEANUP_OUT (file to keep the summary in; default bench/results/cleanup-summary.txt),
# CLEANUP_LATENCY_ONLY=1 (skip part 1), CLEANUP_DELAY (idempotency.cleanup_delay, 5ms),
# CLEANUP_BATCH (idempotency.cleanup_batch_size, 5000),
# CLEANUP_CONF (more postgresql.conf lines, separated by ';', e.g. 'full_page_writes = off'),
# CLEANUP_CLIENT_OPTIONS (PGOPTIONS of the claiming clients, e.g. '-c synchronous_commit=off'),
# CLEANUP_WAITS=1 (sample pg_stat_activity every 2 ms during each window: what the claims
# and the worker wait for, printed per kind of window),
# CLEANUP_NICE (as root: the nice value of the server and pgbench, e.g. -10, so that other
# work on the machine takes less of the CPU from the measurement; the worker, a child of the
# server, runs at the same value as the claims, as on a production server),
# CLEANUP_DATABASES (idempotency.databases: the databases the worker serves, 'bench'; empty:
# every database, as before 2026-12-05: the database postgres, whose extension is there for
# the benchmark's reads, then got a worker of its own at every 100 ms interval during the
# windows with a cleanup, a process started 5 to 10 times a second beside the claims),
# CLEANUP_CPUS (a CPU list for taskset, e.g. 0-1: the server and pgbench run on those CPUs),
# CLEANUP_LIVE_SHARE (part 2 only: one key in this many is loaded live, with 30 days to go,
# among the expired ones: mixed ttls, interleaved, so that no block range of a BRIN ever
# becomes all expired; the live keys stay from one pair of windows to the next).
#
# What the tail depends on is printed with the numbers: the machine (cores, load at the start
# and the end, the kernel), and from the worker's batches in the windows with a cleanup (the
# throttle logs each at DEBUG2, so the server runs with log_min_messages = debug2): how many
# it made a second, how many saw the other sessions working and what it saw of them, their
# keys, their length on the clock and on the CPU, and the worker's share of a core.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../test/lib.sh
source "$HERE/../test/lib.sh"

ROWS="${CLEANUP_ROWS:-1000000}"
LATENCY_SECONDS="${CLEANUP_LATENCY_SECONDS:-3}"
REPS="${CLEANUP_REPS:-3}"
CLIENTS="${CLEANUP_CLIENTS:-4}"
PORT="${CLEANUP_PORT:-5451}"
BATCH="${CLEANUP_BATCH:-5000}"
OUT_FILE="${CLEANUP_OUT:-$IDEM_ROOT/bench/results/cleanup-summary.txt}"

ensure_packages
# Every process started from here on (the server, its backends and workers, pgbench) inherits it.
[[ -n ${CLEANUP_NICE:-} ]] && renice -n "$CLEANUP_NICE" -p $$ >/dev/null
[[ -n ${CLEANUP_CPUS:-} ]] && taskset -pc "$CLEANUP_CPUS" $$ >/dev/null
load_at_start="$(cut -d' ' -f1-3 /proc/loadavg)"
extra_conf=()
IFS=';' read -r -a extra_conf <<<"${CLEANUP_CONF:-}"
[[ ${BENCH_NO_BUILD:-0} == 1 ]] || build_and_install
idem_scratch_init
DIR="$IDEM_SCRATCH/cleanup_bench"
# autovacuum off: every method starts from the same vacuumed table, and no vacuum lands
# in one measurement and not in another. The worker's interval starts long (1 h): rounds
# run only when the benchmark asks for them.
cluster_start "$DIR" "$PORT" \
  "idempotency.cleanup_interval = '1h'" \
  "idempotency.cleanup_batch_size = $BATCH" \
  "idempotency.cleanup_delay = '${CLEANUP_DELAY:-5ms}'" \
  "autovacuum = off" \
  "shared_buffers = '1GB'" \
  "max_wal_size = '8GB'" \
  "checkpoint_timeout = '30min'" \
  "search_path = '\"\$user\", public, idempotency'" \
  "log_min_messages = debug2" \
  "idempotency.databases = '${CLEANUP_DATABASES-bench}'" \
  "${extra_conf[@]}"
cp "$HERE/cleanup/setup.sql" "$HERE/cleanup/claim.sql" "$DIR/"
idem_is_root && chown postgres: "$DIR"/*.sql

q() { pg_psql -d bench -Atc "$1"; }
now_s() { date +%s.%N; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "nan"; else printf "%.2f", a / b }'; }

pg_psql -d postgres -c 'CREATE DATABASE bench'
q 'CREATE EXTENSION idempotency'
pg_psql -d bench -f "$DIR/setup.sql" >/dev/null
# The first cleanup of a database makes the pass over keys of dropped roles (a walk over the
# whole table, deleting nothing here): made now, on the empty table, so that every round
# measured below deletes expired keys.
q 'SELECT idempotency_cleanup()' >/dev/null

# Read from the database postgres (which has the extension for its view, and no keys): a
# session of the database bench, even one that only reads, counts as foreground work for the
# throttle, and the worker's rate alone is measured here.
pg_psql -d postgres -c 'CREATE EXTENSION idempotency' >/dev/null
deleted_so_far() { pg_psql -d postgres -Atc "SELECT coalesce(expired_deleted, 0) FROM idempotency_stats WHERE datname = 'bench'"; }

load() { # N [LIVE_SHARE]: N expired keys (one in LIVE_SHARE live instead) on a vacuumed table
  q "VACUUM idempotency_keys" >/dev/null
  q "SELECT bench_load_expired($1, ${2:-0})" >/dev/null
  q "VACUUM ANALYZE idempotency_keys" >/dev/null
  q "CHECKPOINT" >/dev/null
}

set_interval() {
  q "ALTER SYSTEM SET idempotency.cleanup_interval = '$1'" >/dev/null
  q "SELECT pg_reload_conf()" >/dev/null
}

# Waits until the worker has deleted `target` more keys than `base` (the view counts them
# batch by batch); polls every 20 ms, so the time it returns at is that precise.
wait_worker() {
  local base="$1" target="$2" deadline=$((SECONDS + 600))
  while (($(deleted_so_far) - base < target)); do
    ((SECONDS < deadline)) || idem_die "the worker did not delete $target keys in 10 minutes"
    sleep 0.02
  done
}

echo "== cleanup benchmark: $ROWS expired keys, batches of $BATCH, $(nproc) cores"

# --- 1. deletion rate ----------------------------------------------------------------------

worker_rate=0 worker_s=0 function_rate=0 function_s=0 reference_rate=0 reference_s=0
if [[ ${CLEANUP_LATENCY_ONLY:-0} != 1 ]]; then
load "$ROWS"
base="$(deleted_so_far)"
t0="$(now_s)"
set_interval 100ms
wait_worker "$base" "$ROWS"
t1="$(now_s)"
set_interval 1h
worker_s="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
worker_rate="$(awk -v n="$ROWS" -v s="$worker_s" 'BEGIN { printf "%.0f", n / s }')"
left="$(q 'SELECT count(*) FROM idempotency_keys')"
echo "worker:     $ROWS rows in $worker_s s = $worker_rate rows/s  (left: $left)"

load "$ROWS"
t0="$(now_s)"
n="$(q 'SELECT idempotency_cleanup()')"
t1="$(now_s)"
function_s="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
function_rate="$(awk -v n="$n" -v s="$function_s" 'BEGIN { printf "%.0f", n / s }')"
echo "function:   $n rows in $function_s s = $function_rate rows/s"

load "$ROWS"
t0="$(now_s)"
n="$(q "CALL bench_delete_loop($BATCH)")"
t1="$(now_s)"
reference_s="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
reference_rate="$(awk -v n="$n" -v s="$reference_s" 'BEGIN { printf "%.0f", n / s }')"
echo "reference:  $n rows in $reference_s s = $reference_rate rows/s"
fi

# --- 2. claim latency with and without a running cleanup -----------------------------------

# Alternating windows (without, during, without, during, ...) pooled: drifts in the
# machine's background load then fall on both sides alike.
# Before each pair of windows the table gets 3N more expired keys (then VACUUM, CHECKPOINT);
# after it the worker is stopped and what it left is deleted (drain).
LATENCY_ROWS=$((ROWS * 3))
LIVE_SHARE="${CLEANUP_LIVE_SHARE:-0}"
run_pgbench() { # PREFIX
  [[ ${CLEANUP_WAITS:-0} == 1 ]] && sample_waits "${1%_*}" &
  PGOPTIONS="${CLEANUP_CLIENT_OPTIONS:-}" as_pg pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$LATENCY_SECONDS" \
    -f "$DIR/claim.sql" -l --log-prefix="$DIR/$1" bench >"$DIR/$1.out" 2>&1 ||
    { cat "$DIR/$1.out" >&2; idem_die "pgbench failed"; }
  wait
}
# sample_waits KIND: for the window's length, every 2 ms, what each claiming backend and the
# worker is doing (wait_event_type:wait_event, or CPU when running and not waiting), counted
# in an unlogged table (no WAL of its own).
sample_waits() {
  q "CREATE UNLOGGED TABLE IF NOT EXISTS bench_waits (kind text, who text, what text)" >/dev/null
  q "DO \$\$ DECLARE stop timestamptz := clock_timestamp() + interval '$LATENCY_SECONDS s'; BEGIN
       WHILE clock_timestamp() < stop LOOP
         INSERT INTO bench_waits SELECT '$1',
           CASE WHEN backend_type = 'client backend' THEN 'claim' ELSE 'worker' END,
           coalesce(wait_event_type || ':' || wait_event, CASE state WHEN 'active' THEN 'CPU' ELSE state END)
         FROM pg_stat_activity WHERE application_name = 'pgbench' OR backend_type = 'idempotency cleanup';
         PERFORM pg_stat_clear_snapshot();
         PERFORM pg_sleep(0.002);
       END LOOP; END \$\$" >/dev/null
}
worker_idle() {
  until [[ $(q "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup'") == 0 ]]; do
    sleep 0.05
  done
}
# After a window with the worker: it stops (idempotency.cleanup_worker = off; a round under way
# ends within about a second, and the launcher's next one finds it off) and the keys it left
# are deleted here, so that the next window without a cleanup has none running, whatever the
# throttle left.
drain() {
  q "ALTER SYSTEM SET idempotency.cleanup_worker = off" >/dev/null
  q "SELECT pg_reload_conf()" >/dev/null
  local quiet=0
  while ((quiet < 5)); do
    if [[ $(q "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idempotency cleanup'") == 0 ]]; then
      quiet=$((quiet + 1))
    else
      quiet=0
    fi
    sleep 0.1
  done
  q "DELETE FROM idempotency_keys WHERE key LIKE 'expired-%'" >/dev/null
  q "ALTER SYSTEM RESET idempotency.cleanup_worker" >/dev/null
  q "SELECT pg_reload_conf()" >/dev/null
}
# The worker's batch lines logged from the start of a window with a cleanup to its end (the
# throttle's DEBUG2 line, one per batch), appended to $DIR/batches.log; and the rounds that ran
# in it, to their end (a round lasts up to 10 s: the one under way when the window ends is
# stopped by the drain), appended to $DIR/rounds.log.
log_offset() { stat -c %s "$DIR/server.log"; }
keep_batches() { # OFFSET
  tail -c +"$(($1 + 1))" "$DIR/server.log" | grep -a 'idempotency cleanup: batch of' >>"$DIR/batches.log" || true
}
keep_rounds() { # OFFSET
  tail -c +"$(($1 + 1))" "$DIR/server.log" | grep -a 'idempotency cleanup of database [0-9]*: round of .* keys deleted' >>"$DIR/rounds.log" || true
}
: >"$DIR/batches.log"
: >"$DIR/rounds.log"
during_deleted=0
per_rep=""
left=1
for ((r = 1; r <= REPS; r++)); do
  load "$LATENCY_ROWS" "$LIVE_SHARE"
  run_pgbench "without_$r"
  offset="$(log_offset)"
  set_interval 100ms
  base="$(deleted_so_far)"
  run_pgbench "during_$r"
  keep_batches "$offset"
  during_deleted=$((during_deleted + $(deleted_so_far) - base))
  ((left > 0)) && left="$(q "SELECT count(*) FROM idempotency_keys WHERE key LIKE 'expired-%'")"
  set_interval 1h
  drain
  keep_rounds "$offset"
  read -r _ _ p99w < <("$HERE/cleanup/percentiles.sh" "$DIR"/without_$r.*)
  read -r _ _ p99d < <("$HERE/cleanup/percentiles.sh" "$DIR"/during_$r.*)
  per_rep+=" $(ratio "$p99d" "$p99w")"
done
during_rate="$(awk -v n="$during_deleted" -v s="$((REPS * LATENCY_SECONDS))" 'BEGIN { printf "%.0f", n / s }')"
read -r n_without p50_without p99_without < <("$HERE/cleanup/percentiles.sh" "$DIR"/without_*)
read -r n_during p50_during p99_during < <("$HERE/cleanup/percentiles.sh" "$DIR"/during_*)
covered="yes"
waits=""
[[ ${CLEANUP_WAITS:-0} == 1 ]] && waits="$(q "SELECT format('  %-8s %-6s %5s%%  %s', kind, who, round(100.0 * count(*) / sum(count(*)) OVER (PARTITION BY kind, who), 1), what)
  FROM bench_waits GROUP BY kind, who, what ORDER BY kind DESC, who, count(*) DESC")"
((left > 0)) || covered="no (the expired keys ran out before a window ended)"
# The worker's batches in the windows with a cleanup (the throttle's DEBUG2 lines).
window_s=$((REPS * LATENCY_SECONDS))
rounds="$(wc -l <"$DIR/rounds.log")"
perl -ne 'print "$1 $2 $3 $4 $5 $6 $7 $8 $9 $10 $11\n" if /batch of (\d+) keys, cost (\d+), other sessions ([a-z]+), pause (\d+) ms; took (\d+) us, (\d+) us on CPU; seen: (\d+) transactions of others, (\d+) snapshots; batch (\d+) of the run; CPU since the last pause (\d+) us, pause for the CPU share (\d+) ms/' \
  "$DIR/batches.log" >"$DIR/batches.txt"
# pctl COLUMN: p50, p99 and max of a column of batches.txt
pctl() {
  awk -v c="$1" '{ print $c }' "$DIR/batches.txt" | sort -n |
    awk '{ v[NR] = $1 } END { a = int(NR * 0.5); b = int(NR * 0.99); if (a < 1) a = 1; if (b < 1) b = 1
      printf "p50 %d / p99 %d / max %d us", v[a], v[b], v[NR] }'
}
batches="$(awk -v s="$window_s" -v rounds="$rounds" '
    { n++; keys += $1; if ($3 == "working") { busy++; busy_keys += $1 }; paused += $4; xids += $7; snaps += $8; cpu += $6
      if ($11 > 0 && $11 >= $4) by_cpu++ }
    END {
      if (n == 0) { print "  (no batch logged)"; exit }
      printf "  %d batches in %d s (%.0f a second, in %d rounds), %d saw others working; %.0f keys a batch\n", n, s, n / s, rounds, busy, keys / n
      printf "  keys deleted by the batches that saw others working: %.0f a second (the others ran before the clients'"'"' first claims)\n", busy_keys / s
      printf "  seen at each look (means): %.0f transactions of others since the last, %.2f snapshots\n", xids / n, snaps / n
      printf "  paused %.0f ms a second (%d pauses set by the CPU share); the batches on a CPU %.1f%% of the time\n", paused / s, by_cpu, 100 * cpu / (s * 1e6)
    }' "$DIR/batches.txt")"
[[ -s $DIR/batches.txt ]] && batches+="
  a batch took $(pctl 5) on the clock, $(pctl 6) on the CPU
  $(awk '$9 == 1 { f++; fc += $6 } $9 > 1 { o++; oc += $6 } END {
      printf "on the CPU: a round'"'"'s first batch %.0f us (%d), the others %.0f us (means)", f ? fc / f : 0, f, o ? oc / o : 0 }' "$DIR/batches.txt")
  $(sed -nE 's/.*round of ([0-9]+) ms, ([0-9]+) keys deleted.* ([0-9]+) ms on CPU in it .*, round ([0-9]+) of its process.*/\1 \2 \3 \4/p' "$DIR/rounds.log" |
    awk '{ n++; ms += $1; keys += $2; cpu += $3; if ($4 == 1) { starts++; start_cpu += $3 } }
      END { if (n) printf "a round: %.0f ms, %.0f keys, %.1f ms on the CPU (means of %d); %d processes started, a first round %.1f ms on the CPU from the process'"'"'s start (mean)", ms / n, keys / n, cpu / n, n, starts, starts ? start_cpu / starts : 0 }')
  $(sed -nE 's/.*cleanup of database ([0-9]+): round of ([0-9]+) ms.* ([0-9]+) ms on CPU in it .*/\1 \3/p' "$DIR/rounds.log" |
    awk -v s="$window_s" '{ n[$1]++; cpu[$1] += $2 } END { printf "the workers on a CPU, by database:"; for (d in n) printf " %s: %d rounds, %.0f ms a second (%.1f%%);", d, n[d], cpu[d] / s, cpu[d] / s / 10 }')"
mkdir -p "$(dirname "$OUT_FILE")" && cp "$DIR/batches.txt" "${OUT_FILE%.txt}-batches.txt" && cp "$DIR/rounds.log" "${OUT_FILE%.txt}-rounds.txt" || true

summary="$(
  cat <<EOF
cleanup benchmark ($(date -u +%FT%TZ), $(nproc) cores${CLEANUP_CPUS:+ (CPUs $CLEANUP_CPUS)}, Linux $(uname -r), load $load_at_start at the start and $(cut -d' ' -f1-3 /proc/loadavg) at the end, PostgreSQL $(q 'SHOW server_version'), idempotency.cleanup_delay = $(q 'SHOW idempotency.cleanup_delay')${CLEANUP_CONF:+, $CLEANUP_CONF}${CLEANUP_CLIENT_OPTIONS:+, clients: $CLEANUP_CLIENT_OPTIONS}${CLEANUP_NICE:+, nice $CLEANUP_NICE})
deletion of $ROWS expired keys (batches of $BATCH):
  worker      $worker_rate rows/s  ($worker_s s)
  function    $function_rate rows/s  ($function_s s, idempotency_cleanup(), its own worker)
  reference   $reference_rate rows/s  ($reference_s s, hand-written DELETE ... USING loop)
  ratio worker / reference     $(ratio "$worker_rate" "$reference_rate")   (goal: >= 150000 rows/s absolute)
  ratio function / reference   $(ratio "$function_rate" "$reference_rate")
claim_key latency, pgbench -M prepared, $CLIENTS clients, $REPS x $LATENCY_SECONDS s each way (alternating), $LATENCY_ROWS keys loaded before each pair, $(if ((LIVE_SHARE > 0)); then echo "one in $LIVE_SHARE live for 30 days, the others"; else echo all; fi) expired:
  without cleanup   p50 $p50_without ms   p99 $p99_without ms   ($n_without claims)
  during cleanup    p50 $p50_during ms   p99 $p99_during ms   ($n_during claims; the worker deleted $during_deleted in them, $during_rate rows/s; keys left to delete throughout: $covered)
  ratio p99 during / without   $(ratio "$p99_during" "$p99_without")   (goal: <= 1.5; per window pair:$per_rep)
  ratio p50 during / without   $(ratio "$p50_during" "$p50_without")
the worker's batches in the windows with a cleanup (the throttle's view: other sessions working or idle):
$batches
${waits:+samples of pg_stat_activity every 2 ms (window, backend, share of its samples, state):
$waits}
EOF
)"
echo
echo "$summary"
mkdir -p "$(dirname "$OUT_FILE")"
echo "$summary" >"$OUT_FILE"
cluster_stop "$DIR"
