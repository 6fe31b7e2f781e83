#!/usr/bin/env bash
# The claim race with many processes (issue #22): pgbench clients claim the same new keys
# at once, in the same order (each client's transaction n claims key n; the clients that
# replay catch up with the one that claims, so they keep meeting on new keys). Six clients
# claim and complete in one statement, waiting up to 5 s for a holder; two claim and roll
# back, which wakes the waiters of their keys at once. Afterwards every key has exactly one
# live row (counted in the heap and through the primary key), completed, claimed once; amcheck
# finds the heap and both indexes whole (verify_heapam, bt_index_check with heapallindexed,
# bt_index_parent_check). Losing the race at the primary key takes the loser's tuple back:
# without that, keys would have two live rows.
#
# Run on the direct path and on the executor path (test/paths/executor.*, the setting
# idempotency.executor_path). Ends with "N passed, N failed".
#   IDEM_RACE_CLIENTS=8 IDEM_RACE_KEYS=400 bash test/suites/race.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

build_and_install
idem_scratch_init

CLIENTS="${IDEM_RACE_CLIENTS:-8}"
KEYS="${IDEM_RACE_KEYS:-400}"
ROLLERS=$((CLIENTS / 4)) # the clients (the last ones) that roll their claims back
PASSED=0
FAILED=0
# expect NAME GOT WANTED: one result line; a difference is shown.
expect() {
  if [[ $2 == "$3" ]]; then
    echo "ok - $1"
    PASSED=$((PASSED + 1))
  else
    echo "not ok - $1"
    echo "    got '$2', expected '$3'"
    FAILED=$((FAILED + 1))
    return 1
  fi
}

DIR="$IDEM_SCRATCH/race"
mkdir -p "$DIR"
chmod 755 "$DIR"
cluster_start "$DIR/cluster" "$(idem_free_port 5500 5509)" "max_connections = 40" >/dev/null ||
  idem_die "the race suite's server did not start"
pg_psql -c 'CREATE EXTENSION idempotency' -c 'CREATE EXTENSION amcheck'
q() { pg_psql -At "$@"; }

# script PREFIX: one transaction of a client: through the next key's gate, then that key
# claimed (and completed) or claimed and rolled back. pgbench keeps :n per client.
script() {
  cat <<EOF
\\set n :n + 1
SELECT pg_advisory_lock_shared($GATE, :n);
SELECT pg_advisory_unlock_shared($GATE, :n);
\\if :client_id < $((CLIENTS - ROLLERS))
SELECT count(idempotency.complete_key('$1' || :n, c.token, pg_catalog.jsonb_build_object('by', :client_id)))
  FROM idempotency.claim_key('$1' || :n, wait => '5 s') c WHERE c.token IS NOT NULL;
\\else
BEGIN;
SELECT count(idempotency.complete_key('$1' || :n, c.token, pg_catalog.jsonb_build_object('rolled back', :client_id)))
  FROM idempotency.claim_key('$1' || :n) c WHERE c.token IS NOT NULL;
ROLLBACK;
\\endif
EOF
}

# The gates: a controller session holds an advisory lock (GATE, n) for every key n and
# releases lock n once every client waits for it, so that all clients go for each new key at
# the same moment. It gives up (releasing every gate) when the clients stop coming (10 s).
GATE=4242
gates() {
  cat <<EOF
DO \$\$
BEGIN
  FOR n IN 1 .. $KEYS LOOP PERFORM pg_advisory_lock($GATE, n); END LOOP;
  FOR n IN 1 .. $KEYS LOOP
    FOR i IN 1 .. 10000 LOOP
      EXIT WHEN (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $GATE
                   AND objid = n AND objsubid = 2 AND NOT granted) >= $CLIENTS;
      IF i = 10000 THEN RAISE WARNING 'gate %: the clients did not all come', n; PERFORM pg_advisory_unlock_all(); RETURN; END IF;
      PERFORM pg_sleep(0.001);
    END LOOP;
    PERFORM pg_advisory_unlock($GATE, n);
  END LOOP;
END \$\$;
EOF
}
gates_held() { q -c "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $GATE AND objsubid = 2 AND granted"; }

# race NAME PREFIX [ENV...]: one race on keys PREFIX1 .. PREFIX$KEYS, then the checks.
race() {
  local name="$1" prefix="$2" start log="$DIR/pgbench-$1.log" rc=0
  shift 2
  q -c "SELECT pg_stat_reset_single_table_counters('idempotency.idempotency_keys'::regclass)" >/dev/null
  script "$prefix" >"$DIR/claim-$name.sql"
  chmod 644 "$DIR/claim-$name.sql"
  gates >"$DIR/gates-$name.sql"
  chmod 644 "$DIR/gates-$name.sql"
  pg_psql -f "$DIR/gates-$name.sql" >"$DIR/gates-$name.log" 2>&1 &
  local controller=$!
  for _ in $(seq 200); do (($(gates_held) == KEYS)) && break; sleep 0.05; done
  start=$SECONDS
  as_pg env "$@" pgbench -n -h "$PGHOST" -p "$PGPORT" -U postgres -c "$CLIENTS" -j "$CLIENTS" -t "$KEYS" \
    -D n=0 -f "$DIR/claim-$name.sql" postgres >"$log" 2>&1 || rc=$?
  local took=$((SECONDS - start))
  wait "$controller"
  expect "$name: every client went through every gate" "$(grep -c WARNING "$DIR/gates-$name.log")" 0
  expect "$name: $CLIENTS clients x $KEYS keys ran without an error (pgbench exit $rc)" \
    "$rc $(grep -c 'aborted\|ERROR' "$log")" "0 0" || tail -20 "$log"
  expect "$name: every transaction ran" \
    "$(sed -nE 's/^number of transactions actually processed: ([0-9]+).*/\1/p' "$log")" "$((CLIENTS * KEYS))"
  local like="${prefix//_/\\_}%" heap=(-c "SET enable_indexscan = off" -c "SET enable_indexonlyscan = off"
    -c "SET enable_bitmapscan = off")
  # Live rows, counted in the heap (a sequential scan) and through the primary key.
  expect "$name: no key has two live rows (heap)" "$(q "${heap[@]}" -c "SELECT count(*) FROM (SELECT key
      FROM idempotency.idempotency_keys WHERE key LIKE '$like' GROUP BY key HAVING count(*) > 1) d")" 0
  expect "$name: every key has exactly one live row (heap): $KEYS rows, $KEYS keys" "$(q "${heap[@]}" \
    -c "SELECT count(*) || ' ' || count(DISTINCT key) FROM idempotency.idempotency_keys WHERE key LIKE '$like'")" \
    "$KEYS $KEYS"
  expect "$name: the primary key finds the same rows" "$(q -c "SET enable_seqscan = off" -c "SET enable_bitmapscan = off" \
    -c "SELECT count(*) FROM idempotency.idempotency_keys k, generate_series(1, $KEYS) n
         WHERE k.key = '$prefix' || n AND k.scope = '' AND k.owner = 'postgres'")" "$KEYS"
  expect "$name: every key completed by a committing client, claimed once" "$(q -c "SELECT count(*)
      FROM idempotency.idempotency_keys WHERE key LIKE '$like' AND status = 'completed' AND attempts = 1
       AND response ? 'by'")" "$KEYS"
  expect "$name: amcheck: the heap is whole (verify_heapam)" \
    "$(q -c "SELECT count(*) FROM verify_heapam('idempotency.idempotency_keys')")" 0
  # Every index counted, each B-Tree checked (the expiry index is a BRIN on 16+).
  expect "$name: amcheck: every B-Tree holds exactly the heap's live rows (bt_index_check, heapallindexed)" \
    "$(q -c "SELECT count(CASE WHEN a.amname = 'btree' THEN bt_index_check(x.indexrelid, true)::text
                              ELSE a.amname END)
               FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid JOIN pg_am a ON a.oid = c.relam
              WHERE x.indrelid = 'idempotency.idempotency_keys'::regclass")" 2
  expect "$name: amcheck: the primary key's structure (bt_index_parent_check)" \
    "$(q -c "SELECT count(bt_index_parent_check('idempotency.idempotency_keys_pkey', true))")" 1
  # A super-deleted (taken back) tuple counts as a deletion; nothing else deletes here.
  local taken_back
  taken_back="$(q -c "SELECT n_tup_del FROM pg_stat_user_tables
      WHERE relid = 'idempotency.idempotency_keys'::regclass" | tail -1)"
  echo "    $name: $CLIENTS clients, $KEYS keys, $((CLIENTS * KEYS)) transactions in ${took} s; insertions taken back: ${taken_back:-?}"
  TAKEN_BACK="${taken_back:-0}"
}

race direct race-direct-
# Else the suite proved nothing: on the direct path the clients meet at the primary key.
expect "direct: the race was real: insertions lost at the primary key and were taken back ($TAKEN_BACK)" \
  "$((TAKEN_BACK > 0))" 1

# The executor path as every other suite forces it (test/paths/executor.*: today the
# superuser setting idempotency.executor_path, for the database); its check fails unless a
# claim took that path.
pg_psql -f "$IDEM_SRC/test/paths/executor.setup.sql" >/dev/null
race executor race-executor-
expect "executor: the claims went through the executor" \
  "$(pg_psql -f "$IDEM_SRC/test/paths/executor.check.sql" >/dev/null 2>&1 && echo taken)" taken

cluster_stop "$DIR/cluster"
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
