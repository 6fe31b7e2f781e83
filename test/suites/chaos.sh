#!/usr/bin/env bash
# Exactly-once under faults, short mode (part of `make test`; about two minutes):
#   1. 500 payment messages, each delivered 2-5 times, shuffled, to 8 consumer processes,
#      with consumers killed mid-transaction / mid-two-phase, one immediate server crash,
#      2-second leases that expire and are reclaimed (test/chaos/chaos.py);
#   2. the same with 300 messages through PgBouncer in transaction pooling mode;
#   3. batch consumers: 400 messages handed out up to 20 deliveries at a time to 6 consumers
#      (claim_keys / complete_keys in one transaction per batch), killed inside the batch
#      transaction, one server crash;
#   4. self-test: consumers with a deliberate bug (a debit on replay, a reclaim that
#      ignores the recovery point, a batch that applies later copies of a key it claimed)
#      must make the harness fail.
# The long mode is `test/chaos/run.sh --long` (docs/reliability.md).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

ensure_packages
build_and_install
idem_scratch_init

PASSED=0
FAILED=0
CHAOS="$IDEM_ROOT/test/chaos/chaos.py"

run_chaos() { # NAME ARGS...
  local name="$1" dir="$IDEM_SCRATCH/$1"
  shift
  mkdir -p "$dir"
  echo "## $name: chaos.py run $*"
  /usr/bin/python3 "$CHAOS" run --workdir "$dir" "$@" 2>&1 | tee "$dir.log" | grep -v '^ok - '
  idem_count_run "$dir.log"
}

run_chaos direct --port 5470 --messages 500 --consumers 8 --crashes 1 --timeout 300
run_chaos pgbouncer --port 5472 --messages 300 --consumers 8 --crashes 1 --pgbouncer --timeout 300
run_chaos batch --port 5474 --patterns batch --messages 400 --batch-size 20 --consumers 6 --crashes 1 --timeout 300
# The same exactly-once checks against the portable edition (portable/, its one script).
PORTABLE_SQL="$IDEM_SCRATCH/idempotency-portable.sql"
bash "$IDEM_ROOT/portable/tools/generate.sh" psql >"$PORTABLE_SQL" && chmod 644 "$PORTABLE_SQL"
run_chaos portable --port 5476 --messages 300 --consumers 8 --crashes 1 --timeout 300 --portable "$PORTABLE_SQL"
run_chaos portable-batch --port 5477 --patterns batch --messages 400 --batch-size 20 --consumers 6 --crashes 1 \
  --timeout 300 --portable "$PORTABLE_SQL"

# Self-test: the harness must catch a consumer that breaks exactly-once.
expect_caught() { # NAME SABOTAGE PATTERN [CHAOS.PY OPTIONS...]
  local dir="$IDEM_SCRATCH/$1"
  mkdir -p "$dir"
  /usr/bin/python3 "$CHAOS" run --workdir "$dir" --port 5475 --messages 80 --kill-rate 0.2 \
    --crashes 0 --tampered 0 --sabotage "$2" "${@:4}" >"$dir.log" 2>&1
  idem_count_caught "$dir.log" "$3" "$2"
}
expect_caught sabotage-inbox debit-on-replay "inbox: every account's debit"
expect_caught sabotage-2pc ignore-recovery-point "two-phase: an external call is repeated"
expect_caught sabotage-batch apply-batch-duplicates "batch: each of" --patterns batch --batch-kill-rate 0.2

echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
