#!/usr/bin/env bash
# Exactly-once with batch consumers (issue #15), with faults: 1,500 payment messages, each
# delivered 2-4 times, shuffled, to 4 concurrent examples/python/batch_consumer.py processes
# (one transaction per batch of 40: claim_keys, one INSERT for the claimed messages,
# complete_keys, COMMIT). Two consumers roll a batch back once (a simulated crash after the
# writes) and two are killed with SIGKILL mid-run; the broker then redelivers their
# messages. Then 1,000 more messages, the same way, while the server crashes (immediate
# stop) mid-run and restarts; the broker redelivers them. Checks: every message applied
# exactly once, the balances, and that a last delivery of everything only replays.
# Ends with "N passed, N failed".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"

build_and_install
idem_scratch_init

PASSED=0
FAILED=0
check() { # NAME CONDITION...
  local name="$1"
  shift
  if "$@"; then
    echo "ok - $name"
    PASSED=$((PASSED + 1))
  else
    echo "not ok - $name"
    FAILED=$((FAILED + 1))
  fi
}

DIR="$IDEM_SCRATCH/batch-consumers"
mkdir -p "$DIR"
chmod 755 "$DIR"
cluster_start "$DIR/cluster" "$(idem_free_port 5450 5459)" >/dev/null
pg_psql -d postgres -c "CREATE ROLE batch_app LOGIN"
CONSUMER="$IDEM_ROOT/examples/python/batch_consumer.py"
APP="host=$PGHOST port=$PGPORT dbname=postgres user=batch_app"
ADMIN="host=$PGHOST port=$PGPORT dbname=postgres user=postgres"

# The broker's deliveries: 4 files of shuffled, duplicated messages; the expected balances.
/usr/bin/python3 - "$DIR" <<'PY'
import json, random, sys
rng = random.Random(20261201)
d = sys.argv[1]
msgs = [{"id": f"pay-{i}", "account": f"acct-{i % 7}", "amount": rng.randint(1, 1000)} for i in range(1, 2501)]
for name, part in (("deliveries", msgs[:1500]), ("crash", msgs[1500:])):
    deliveries = [m for m in part for _ in range(rng.randint(2, 4))]
    rng.shuffle(deliveries)
    for c in range(4):
        with open(f"{d}/{name}-{c + 1}.jsonl", "w") as f:
            for m in deliveries[c::4]:
                f.write(json.dumps(m) + "\n")
balances = {}
for m in msgs:
    balances[m["account"]] = balances.get(m["account"], 0) + m["amount"]
with open(f"{d}/expected.json", "w") as f:
    json.dump(balances, f, sort_keys=True)
print(f"{len(msgs)} messages")
PY

/usr/bin/python3 "$CONSUMER" --dsn "$APP" --setup --setup-dsn "$ADMIN" /dev/null >"$DIR/setup.log" 2>&1 ||
  { cat "$DIR/setup.log"; idem_die "setup failed"; }

consume() { # N EXTRA...: consumer N on its deliveries (FILES: deliveries or crash)
  local n="$1"
  shift
  # exec: a background consume is then the consumer process itself, which kill -9 ends.
  exec /usr/bin/python3 "$CONSUMER" --dsn "$APP" --name "c$n" --batch-size 40 "$@" "$DIR/${FILES:-deliveries}-$n.jsonl"
}
pids=()
for n in 1 2 3 4; do
  extra=()
  # c1, c3 roll batch 3 back once; c2, c4 are slow (so that they are killed mid-run).
  if ((n % 2 == 1)); then extra=(--crash-batch 3); else extra=(--batch-delay 0.05); fi
  consume "$n" "${extra[@]}" >"$DIR/c$n.log" 2>&1 &
  pids+=($!)
done
# Kill c2 and c4 once each has committed a few batches.
for log in "$DIR/c2.log" "$DIR/c4.log"; do
  for _ in $(seq 100); do (($(grep -c "batch of" "$log" 2>/dev/null || true) >= 3)) && break; sleep 0.05; done
done
kill -9 "${pids[1]}" "${pids[3]}" 2>/dev/null
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
check "the rolled-back batches were redelivered (c1, c3)" grep -q "crashed" "$DIR/c1.log"
# Redelivery of what the killed consumers did not acknowledge (here: all their deliveries).
for n in 2 4; do (consume "$n" >"$DIR/c$n-again.log" 2>&1); done
check "the killed consumers did not finish their first delivery" \
  bash -c "! grep -q balances '$DIR/c2.log' && ! grep -q balances '$DIR/c4.log'"
check "no consumer died of an error" bash -c "! grep -l Traceback '$DIR'/c*.log"
# Round 2: a server crash mid-run. Every consumer dies with its connection (that is the
# point); the server restarts and the broker redelivers every unacknowledged delivery.
pids=()
for n in 1 2 3 4; do
  (FILES=crash consume "$n" --batch-delay 0.05 >"$DIR/crash-c$n.log" 2>&1) &
  pids+=($!)
done
for _ in $(seq 100); do (($(cat "$DIR"/crash-c*.log | grep -c "batch of" || true) >= 8)) && break; sleep 0.05; done
as_pg pg_ctl -D "$DIR/cluster/data" -m immediate -w stop >/dev/null
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
check "the crash interrupted the consumers mid-run" bash -c "! grep -q balances '$DIR'/crash-c*.log"
as_pg pg_ctl -D "$DIR/cluster/data" -l "$DIR/cluster/server.log" -w start >/dev/null
for n in 1 2 3 4; do (FILES=crash consume "$n" >"$DIR/crash-c$n-again.log" 2>&1) & done
wait
check "after the restart no redelivering consumer died of an error" bash -c "! grep -l Traceback '$DIR'/crash-c*-again.log"

# A last delivery of everything: every message only replays.
cat "$DIR"/deliveries-*.jsonl "$DIR"/crash-*.jsonl >"$DIR/all.jsonl"
/usr/bin/python3 "$CONSUMER" --dsn "$APP" --name last --batch-size 500 "$DIR/all.jsonl" >"$DIR/last.log" 2>&1

q() { as_pg psql -X -At -d postgres -c "$1"; }
check "every message applied exactly once (2500 ledger rows, 2500 messages)" \
  test "$(q "SELECT count(*) || ' ' || count(DISTINCT message_id) FROM batch_ledger")" = "2500 2500"
check "no consumer saw a message applied twice" \
  bash -c "! grep -h 'applied more than once' '$DIR'/*.log | grep -qv ': 0$'"
check "the balances are the sums of the messages" \
  test "$(q "SELECT json_object_agg(id, balance ORDER BY id)::jsonb::text FROM batch_accounts")" = \
  "$(/usr/bin/python3 -c "import json; print(json.dumps(json.load(open('$DIR/expected.json')), sort_keys=True, separators=(', ', ': ')))")"
check "a last delivery of everything claims nothing" bash -c "! grep -E 'claimed|reclaimed' '$DIR/last.log'"
check "and replays the messages" grep -q "replay" "$DIR/last.log"
check "every key is completed" test "$(q "SELECT count(*) FROM idempotency.idempotency_keys WHERE status = 'processing'")" = 0

cluster_stop "$DIR/cluster"
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
