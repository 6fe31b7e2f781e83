#!/usr/bin/env bash
# Suite: the extension on a Citus 13 cluster (a coordinator and two workers on this machine,
# ports 5481-5483; the chaos run 5484-5486): the recipe of test/citus/setup.sql, then the claim protocol through the
# coordinator (statuses, in_progress for an open transaction, waiting, fencing, per-role
# keys, NULL keys), and the cleanup worker of each node deleting expired keys from its own
# shards (test/citus/check.py), batches through the coordinator; then the chaos harness
# against its own cluster (consumer kills, a worker and the coordinator crashed; a sabotaged
# consumer must be caught). Runs when Citus is installed for the server under test
# (CONTRIBUTING.md says how to build it); otherwise it says so and counts nothing.
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "$0")/../lib.sh"
ensure_packages
build_and_install
idem_scratch_init

if [[ ! -f "$("$IDEM_PG_CONFIG" --pkglibdir)/citus.so" ]]; then
  echo "# Citus is not installed for $("$IDEM_PG_CONFIG" --version): nothing to run"
  echo "0 passed, 0 failed"
  exit 0
fi

ports=(5481 5482 5483)
dsns=()
for port in "${ports[@]}"; do
  dir="$IDEM_SCRATCH/citus-$port"
  cluster_start "$dir" "$port" \
    "listen_addresses = '127.0.0.1'" \
    "shared_preload_libraries = 'citus,idempotency'" \
    "idempotency.cleanup_interval = '1s'" \
    "max_prepared_transactions = 20" || { echo "1 passed, 1 failed"; exit 1; }
  pg_psql -h "$dir" -p "$port" -c 'CREATE EXTENSION citus' >/dev/null || exit 1
  dsns+=("host=127.0.0.1 port=$port user=postgres dbname=postgres")
done

coordinator=(-h 127.0.0.1 -p "${ports[0]}")
pg_psql "${coordinator[@]}" -c "SELECT citus_set_coordinator_host('127.0.0.1', ${ports[0]})" \
  -c "SELECT citus_add_node('127.0.0.1', ${ports[1]})" \
  -c "SELECT citus_add_node('127.0.0.1', ${ports[2]})" >/dev/null || exit 1
pg_psql "${coordinator[@]}" -f "$IDEM_SRC/test/citus/setup.sql" >/dev/null || exit 1
pg_psql "${coordinator[@]}" -c 'CREATE ROLE citus_app LOGIN' -c 'CREATE ROLE citus_other LOGIN' \
  -c 'GRANT USAGE ON SCHEMA idempotency TO citus_app, citus_other' >/dev/null || exit 1

PASSED=0
FAILED=0

/usr/bin/python3 "$IDEM_SRC/test/citus/check.py" "${dsns[@]}" 2>&1 | tee "$IDEM_SCRATCH/check.log" | grep -v -E '^[0-9]+ passed'
idem_count_run "$IDEM_SCRATCH/check.log"
# No node crashed.
crashed=0
for port in "${ports[@]}"; do
  grep -q 'terminated by signal' "$IDEM_SCRATCH/citus-$port/server.log" && crashed=1
done
if ((crashed)); then
  echo "not ok - a node of the cluster crashed (server.log)"
  FAILED=$((FAILED + 1))
fi

# The chaos harness against its own coordinator + 2 workers (ports 5484-5486): consumer
# kills, a worker and the coordinator crashed (test/chaos/chaos.py --citus).
chaos() { # NAME ARGS...
  local dir="$IDEM_SCRATCH/$1"
  shift
  mkdir -p "$dir"
  /usr/bin/python3 "$IDEM_SRC/test/chaos/chaos.py" run --workdir "$dir" --port 5484 --citus "$@" >"$dir.log" 2>&1
}
echo "## chaos.py run --citus --patterns inbox,2pc,batch --messages 300 --crashes 2"
chaos chaos-citus --patterns inbox,2pc,batch --batch-kill-rate 0.3 --messages 300 --consumers 8 --crashes 2 --timeout 120
grep -v '^ok - ' "$IDEM_SCRATCH/chaos-citus.log" | grep -v -E '^[0-9]+ passed'
grep '^ok - ' "$IDEM_SCRATCH/chaos-citus.log"
idem_count_run "$IDEM_SCRATCH/chaos-citus.log"
# Self-test: on Citus too, the harness catches a consumer that applies an effect on replay.
chaos sabotage-citus --messages 80 --kill-rate 0.2 --crashes 0 --tampered 0 --sabotage debit-on-replay
if grep -q "^not ok - inbox: every account's debit" "$IDEM_SCRATCH/sabotage-citus.log"; then
  echo "ok - self-test on Citus: sabotage 'debit-on-replay' is caught"
  PASSED=$((PASSED + 1))
else
  echo "not ok - self-test on Citus: sabotage 'debit-on-replay' went unnoticed (see $IDEM_SCRATCH/sabotage-citus.log)"
  FAILED=$((FAILED + 1))
fi

echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
