#!/usr/bin/env bash
# The completion's write (issue 39, "the floor, moved"), on a throw-away server:
#
#   1. instructions per transaction (callgrind on a single-user backend, as bench/run.sh
#      instructions counts them) of claim + complete in one statement, the bare INSERT, the
#      same writes by hand (INSERT, then an UPDATE that moves expires_at), the bare INSERT
#      plus a HOT update of the same row (an UPDATE that leaves expires_at), a new key and a
#      replay with their floors;
#   2. WAL bytes per key of the same writes (pg_current_wal_lsn before and after HOT_WAL_TX
#      transactions of one pgbench client), and the HOT ratio of each table's updates
#      (n_tup_hot_upd / n_tup_upd);
#   3. the primary key's and the expiry index's size after HOT_KEYS (1M) keys claimed and
#      completed (claim + complete in one statement, 10000 per transaction);
#   4. the cleanup with mixed ttls: HOT_CLEANUP_ROWS (1M) keys, interleaved 90% expired (a
#      24 h ttl, passed) and 10% with 30 days to go (time simulated by writing expires_at,
#      loaded in insertion order, then VACUUM ANALYZE); idempotency_cleanup() timed, the keys
#      left checked (every expired key gone, every other kept), then a second call timed
#      (nothing to delete: what a round costs that finds only live keys); and the same on
#      keys all expired.
#
#   bash bench/hot_completion.sh                     the layout of the installed version
#   HOT_LAYOUT=btree bash bench/hot_completion.sh    the B-Tree on expires_at (1.3.0's
#                                                    layout) on any major, for a before/after
#
# Environment: PG_CONFIG (test/lib.sh), HOT_PORT (5463), HOT_KEYS (1000000), HOT_WAL_TX
# (20000), HOT_CLEANUP_ROWS (1000000), HOT_CALLGRIND_RUNS ("50 300"), HOT_CLEANUP_ONLY=1 (part 4
# alone), BENCH_NO_BUILD=1 (use the installed extension). Prints a summary; asserts nothing but the cleanup's correctness.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../test/lib.sh
source "$HERE/../test/lib.sh"

PORT="${HOT_PORT:-5463}"
KEYS="${HOT_KEYS:-1000000}"
WAL_TX="${HOT_WAL_TX:-20000}"
CLEANUP_ROWS="${HOT_CLEANUP_ROWS:-1000000}"
read -ra CALLGRIND_RUNS <<<"${HOT_CALLGRIND_RUNS:-50 300}"
LAYOUT="${HOT_LAYOUT:-installed}"
NKEYS=20000

IDEM_PACKAGES+=(valgrind)
ensure_packages
[[ ${BENCH_NO_BUILD:-0} == 1 ]] || build_and_install
idem_scratch_init
DIR="$IDEM_SCRATCH/hot_completion"
# autovacuum off: no vacuum lands in one measurement and not in another (the cleanup part
# vacuums where it says so). full_page_writes off: the WAL counted is the records' own, not
# the page images that depend on where the last checkpoint fell.
cluster_start "$DIR" "$PORT" \
  "autovacuum = off" \
  "shared_buffers = '512MB'" \
  "max_wal_size = '16GB'" \
  "checkpoint_timeout = '1h'" \
  "synchronous_commit = off" \
  "full_page_writes = off" \
  "idempotency.cleanup_interval = '24h'" \
  "search_path = '\"\$user\", public, idempotency'"

q() { pg_psql -d postgres -Atc "$1"; }
now_s() { date +%s.%N; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) print "nan"; else printf "%.2f", a / b }'; }

q 'CREATE EXTENSION idempotency'
if [[ $LAYOUT == btree ]]; then
  q 'DROP INDEX idempotency.idempotency_keys_expires_at_idx'
  q 'CREATE INDEX idempotency_keys_expires_at_idx ON idempotency.idempotency_keys (expires_at)'
fi
# The access method and key of table $1's indexes but its primary key.
expiry_index_am() {
  q "SELECT string_agg(a.amname || ' (' || pg_get_indexdef(i.oid, 1, true) || ')', ', ')
       FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_am a ON a.oid = i.relam
      WHERE x.indrelid = '$1'::regclass AND NOT x.indisprimary"
}
# The benchmark's tables and functions (bench/sql/setup.sql), on this extension.
sed '/^CREATE EXTENSION idempotency;/d' "$HERE/sql/setup.sql" >"$DIR/setup.sql"
idem_is_root && chown postgres: "$DIR/setup.sql"
pg_psql -d postgres -v nkeys="$NKEYS" -f "$DIR/setup.sql" >/dev/null
# The preloaded keys carry no owner stamp: the first cleanup adopts them (an UPDATE of every
# one) and makes the pass over keys of dropped roles. Done now, so that no measurement below
# pays for it.
q 'SELECT idempotency_cleanup()' >/dev/null
q 'VACUUM ANALYZE'
echo "== the completion's write: PostgreSQL $(q 'SHOW server_version'), expiry index:" \
  "$(expiry_index_am idempotency.idempotency_keys) (floor_keys: $(expiry_index_am floor_keys)), $(nproc) cores, $(date -u '+%F %H:%M UTC')"

# The statements, by name, from bench/sql/instructions.txt.
statement() { grep "^$1|" "$HERE/sql/instructions.txt" | cut -d'|' -f2-; }
MEASURED=(inbox floor_v7 floor_pair_txn_clock floor_pair_txn claim_v7 replay pk_select_replay)

# HOT_CLEANUP_ONLY=1: part 4 alone.
if [[ ${HOT_CLEANUP_ONLY:-0} != 1 ]]; then

# --- 1. instructions -----------------------------------------------------------------------

# instructions_of N PREFIX STATEMENT: instructions of a single-user backend that prepares
# STATEMENT and executes it N times (keys drawn with a fixed seed: the same on every run).
instructions_of() {
  local n="$1" prefix="$2" statement="$3" file="$DIR/instructions.sql" out="$DIR/callgrind.out" i
  RANDOM=39
  {
    if [[ -n $prefix ]]; then
      echo "PREPARE p(text) AS $statement;"
      for ((i = 0; i < n; i++)); do echo "EXECUTE p('$prefix$((RANDOM % NKEYS + 1))');"; done
    elif [[ $statement == *' ;; '* ]]; then
      echo "PREPARE p AS ${statement%% ;; *};"
      echo "PREPARE q AS ${statement#* ;; };"
      for ((i = 0; i < n; i++)); do echo "EXECUTE p; EXECUTE q;"; done
    else
      echo "PREPARE p AS $statement;"
      for ((i = 0; i < n; i++)); do echo "EXECUTE p;"; done
    fi
  } | as_pg tee "$file" >/dev/null
  as_pg valgrind --tool=callgrind --callgrind-out-file="$out" \
    postgres --single -D "$DIR/data" -c synchronous_commit=off postgres \
    <"$file" >"$DIR/instructions.log" 2>&1 ||
    { tail -5 "$DIR/instructions.log" >&2; idem_die "single-user backend failed"; }
  if grep -q ERROR "$DIR/instructions.log"; then
    grep -m3 ERROR "$DIR/instructions.log" >&2
    idem_die "a statement failed in the instruction count"
  fi
  sed -n 's/^summary: \([0-9]*\)/\1/p' "$out"
}

declare -A INSTR
env_before="$(declare -p PGHOST PGPORT PGUSER PGDATABASE)"
cluster_stop "$DIR"
for name in "${MEASURED[@]}"; do
  IFS='|' read -r prefix text <<<"$(statement "$name")"
  small="$(instructions_of "${CALLGRIND_RUNS[0]}" "$prefix" "$text")"
  large="$(instructions_of "${CALLGRIND_RUNS[1]}" "$prefix" "$text")"
  INSTR[$name]=$(((large - small) / (CALLGRIND_RUNS[1] - CALLGRIND_RUNS[0])))
done
as_pg pg_ctl -D "$DIR/data" -l "$DIR/server.log" -w -t 60 start >/dev/null ||
  idem_die "the server did not start again"
eval "$env_before"
export PGHOST PGPORT PGUSER PGDATABASE

echo "instructions per transaction (callgrind, runs of ${CALLGRIND_RUNS[*]}):"
for name in "${MEASURED[@]}"; do printf '  %-22s %8d\n' "$name" "${INSTR[$name]}"; done
echo "  claim + complete / bare INSERT              $(ratio "${INSTR[inbox]}" "${INSTR[floor_v7]}")   (goal on 16+: <= 1.20)"
echo "  claim + complete / the same writes by hand  $(ratio "${INSTR[inbox]}" "${INSTR[floor_pair_txn_clock]}")   (goal: <= 1.00)"
echo "  new key / bare INSERT                       $(ratio "${INSTR[claim_v7]}" "${INSTR[floor_v7]}")   (goal: <= 1.00)"
echo "  replay / primary-key SELECT                 $(ratio "${INSTR[replay]}" "${INSTR[pk_select_replay]}")   (goal: <= 1.05)"

# --- 2. WAL bytes per key and HOT ratio ----------------------------------------------------

# wal_of NAME: WAL bytes per transaction of WAL_TX transactions of the statement, one
# pgbench client (full_page_writes off: the records alone).
wal_of() {
  local name="$1" file="$DIR/$1.pgbench" text before after
  IFS='|' read -r _ text <<<"$(statement "$name")"
  if [[ $text == *' ;; '* ]]; then
    printf 'BEGIN;\n%s;\n%s;\nCOMMIT;\n' "${text%% ;; *}" "${text#* ;; }"
  else
    printf '%s;\n' "$text"
  fi | as_pg tee "$file" >/dev/null
  q 'CHECKPOINT' >/dev/null
  before="$(q 'SELECT pg_current_wal_insert_lsn()')"
  as_pg pgbench -n -M prepared -c 1 -t "$WAL_TX" -f "$file" postgres >"$DIR/$name.out" 2>&1 ||
    { cat "$DIR/$name.out" >&2; idem_die "pgbench failed"; }
  after="$(q 'SELECT pg_current_wal_insert_lsn()')"
  q "SELECT round(pg_wal_lsn_diff('$after', '$before') / $WAL_TX)"
}
hot_of() { # TABLE: "hot/updates" of the table since the last reset
  q "SELECT pg_stat_force_next_flush()" >/dev/null 2>&1 || true
  q "SELECT n_tup_hot_upd || '/' || n_tup_upd FROM pg_stat_user_tables WHERE relid = '$1'::regclass"
}
q 'SELECT pg_stat_reset()' >/dev/null
declare -A WAL HOT
for name in inbox floor_v7 floor_pair_txn_clock floor_pair_txn; do
  table=floor_keys
  [[ $name == inbox ]] && table=idempotency.idempotency_keys
  q 'SELECT pg_stat_reset()' >/dev/null
  WAL[$name]="$(wal_of "$name")"
  sleep 1 # the cumulative statistics of pgbench's backend, flushed at its exit
  HOT[$name]="$(hot_of "$table")"
done
echo "WAL bytes per transaction ($WAL_TX transactions, one client, full_page_writes off) and HOT updates / updates:"
for name in inbox floor_v7 floor_pair_txn_clock floor_pair_txn; do
  printf '  %-22s %6s   HOT %s\n' "$name" "${WAL[$name]}" "${HOT[$name]}"
done
echo "  claim + complete / bare INSERT + HOT update  $(ratio "${WAL[inbox]}" "${WAL[floor_pair_txn]}")   (goal on 16+: <= 1.10)"
echo "  claim + complete / the same writes by hand   $(ratio "${WAL[inbox]}" "${WAL[floor_pair_txn_clock]}")"

# --- 3. index sizes after HOT_KEYS completed keys ------------------------------------------

q 'TRUNCATE idempotency.idempotency_keys' >/dev/null
q 'SELECT pg_stat_reset()' >/dev/null
t0="$(now_s)"
q "DO \$\$ BEGIN
  FOR i IN 1..$(((KEYS + 9999) / 10000)) LOOP
    PERFORM c.status FROM generate_series(1, 10000) g,
      LATERAL claim_key('k' || i || '-' || g, bench_fp()) cl,
      LATERAL complete_key('k' || i || '-' || g, cl.token, '{\"status\": \"ok\"}', 200) c;
    COMMIT;
  END LOOP;
END \$\$" >/dev/null
t1="$(now_s)"
sleep 1
echo "after $KEYS keys claimed and completed ($(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s, 10000 per transaction):"
q "SELECT format('  primary key %s, expiry index %s, table %s; HOT updates / updates %s',
         pg_size_pretty(pg_relation_size('idempotency.idempotency_keys_pkey')),
         pg_size_pretty(pg_relation_size('idempotency.idempotency_keys_expires_at_idx')),
         pg_size_pretty(pg_relation_size('idempotency.idempotency_keys')),
         (SELECT n_tup_hot_upd || '/' || n_tup_upd FROM pg_stat_user_tables
           WHERE relid = 'idempotency.idempotency_keys'::regclass))"
# Leaf entries of the primary key per key (pageinspect): 1.00 when every completion was a
# HOT update; each non-HOT completion adds one.
if q 'CREATE EXTENSION IF NOT EXISTS pageinspect' >/dev/null 2>&1; then
  q "SELECT format('  primary-key leaf entries per key %s', round(sum(s.live_items + s.dead_items)::numeric / $KEYS, 2))
       FROM generate_series(1, (pg_relation_size('idempotency.idempotency_keys_pkey') / 8192 - 1)::int) b,
            LATERAL bt_page_stats('idempotency.idempotency_keys_pkey', b) s WHERE s.type = 'l'"
else
  echo "  (pageinspect is not installed: entries per key not counted)"
fi

fi # HOT_CLEANUP_ONLY

# --- 4. the cleanup with mixed ttls --------------------------------------------------------

# Keys in insertion order: nine in ten completed 24 h before and passed (their expiry in
# the last hour), one in ten with 30 days to go.
load_mixed() { # N LONG_SHARE (0 or 10: one key in that many has 30 days to go)
  q 'TRUNCATE idempotency.idempotency_keys' >/dev/null
  q "INSERT INTO idempotency.idempotency_keys (key, owner, owner_oid, owner_system, ttl, lease,
                                               created_at, expires_at, updated_at, status, response)
     SELECT 'm' || g, current_user, (SELECT oid FROM pg_roles WHERE rolname = current_user),
            (SELECT system_identifier FROM pg_control_system()),
            CASE WHEN $2 > 0 AND g % $2 = 0 THEN interval '30 days' ELSE interval '24 hours' END,
            '5 minutes', now() - interval '25 hours' + g * interval '1 ms',
            CASE WHEN $2 > 0 AND g % $2 = 0 THEN now() + interval '29 days' + g * interval '1 ms'
                 ELSE now() - interval '1 hour' + g * interval '1 us' END,
            now(), 'completed', '{\"ok\": true}'
       FROM generate_series(1, $1) g" >/dev/null
  q 'VACUUM ANALYZE idempotency.idempotency_keys' >/dev/null
  q 'CHECKPOINT' >/dev/null
}
timed_cleanup() { # prints "deleted seconds"
  local t0 t1 n
  t0="$(now_s)"
  n="$(q 'SELECT idempotency_cleanup()')"
  t1="$(now_s)"
  echo "$n $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", b - a }')"
}
echo "cleanup (idempotency_cleanup(), batches of $(q 'SHOW idempotency.cleanup_batch_size')):"
load_mixed "$CLEANUP_ROWS" 0
read -r n s < <(timed_cleanup)
echo "  all expired:  $n of $CLEANUP_ROWS keys in $s s = $(awk -v n="$n" -v s="$s" 'BEGIN { printf "%.0f", n / s }') rows/s   (goal: >= 150000)"
load_mixed "$CLEANUP_ROWS" 10
read -r n s < <(timed_cleanup)
left="$(q "SELECT count(*) || ' left, ' || count(*) FILTER (WHERE expires_at <= now()) || ' of them expired' FROM idempotency.idempotency_keys")"
expected_left=$((CLEANUP_ROWS / 10))
echo "  mixed ttls:   $n keys in $s s = $(awk -v n="$n" -v s="$s" 'BEGIN { printf "%.0f", n / s }') rows/s; $left"
[[ $left == "$expected_left left, 0 of them expired" ]] ||
  idem_die "the cleanup with mixed ttls left '$left', not $expected_left keys none of them expired"
read -r n s < <(timed_cleanup)
echo "  again:        $n keys in $s s (a round that finds only the $expected_left live keys)"
cluster_stop "$DIR"
