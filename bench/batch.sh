#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Batch benchmark (issue #15): keys per second of claim_keys for batches of 1, 10, 100 and
# 1000 keys per call against one claim_key per round trip, the floor (a hand-written
# INSERT .. SELECT unnest(..) ON CONFLICT DO NOTHING RETURNING of the same batch) and, for
# replays, a batched primary-key SELECT .. WHERE key = ANY(..); v7 and random keys;
# synchronous_commit = on, fsync on. Then the wait handoff: how long after the holder's
# COMMIT a waiting claim_key (wait > 0) returns. Only ratios within one run mean anything.
#
#   bench/batch.sh [PART...]   PART: batches million handoff (default: all three);
#                              PG_CONFIG chooses the installation (test/lib.sh)
# Environment: BATCH_SECONDS (3 per pgbench run), BATCH_REPS (3, interleaved; medians), BATCH_CLIENTS (4), BATCH_SIZES ("1 10 100
# 1000"), BATCH_PORT (5470), HANDOFFS (200), BENCH_NO_BUILD=1.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../test/lib.sh"

SECONDS_PER_RUN="${BATCH_SECONDS:-3}"
REPS="${BATCH_REPS:-3}"
CLIENTS="${BATCH_CLIENTS:-4}"
SIZES="${BATCH_SIZES:-1 10 100 1000}"
PORT="${BATCH_PORT:-5470}"
HANDOFFS="${HANDOFFS:-200}"
NKEYS=100000

if [[ ${BENCH_NO_BUILD:-0} != 1 ]]; then build_and_install; fi
idem_scratch_init
cluster_start "$IDEM_SCRATCH/batch" "$PORT" \
  "fsync = on" "synchronous_commit = on" "shared_buffers = 128MB" "max_wal_size = 16GB" \
  "checkpoint_timeout = 1h" "autovacuum = off" "max_connections = 40" \
  "log_min_messages = warning" "search_path = '\"\$user\", public, idempotency'"
pg_psql -q -v nkeys="$NKEYS" -f "$HERE/sql/setup.sql" >/dev/null

PARTS=("$@")
((${#PARTS[@]})) || PARTS=(batches million handoff)
want() { [[ " ${PARTS[*]} " == *" $1 "* ]]; }

OUT="$IDEM_SCRATCH/batch.tsv"
: >"$OUT"
# run WORKLOAD N: one pgbench run; appends "workload n tps keys_per_second".
run() {
  local name="$1" n="$2" out tps per
  out="$(as_pg pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$SECONDS_PER_RUN" -D n="$n" -D nkeys="$NKEYS" \
    -f "$HERE/batch/$name.sql" 2>&1)" || { printf '%s\n' "$out" >&2; idem_die "pgbench failed: $name n=$n"; }
  tps="$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$out" | tail -1)"
  per="$n"
  [[ $name == claim_key_* || $name == replay_key ]] && per=1
  printf '%s\t%s\t%s\t%s\n' "$name" "$n" "$tps" "$(python3 -c "print(round($tps * $per))")" | tee -a "$OUT"
}

if want batches; then
idem_log "batches: $CLIENTS clients, $REPS x ${SECONDS_PER_RUN}s per workload (interleaved), sizes $SIZES"
for ((rep = 1; rep <= REPS; rep++)); do
  for key in v7 rand; do run "claim_key_$key" 1; done
  run replay_key 1
  for n in $SIZES; do
    for key in v7 rand; do
      run "claim_keys_$key" "$n"
      run "floor_$key" "$n"
    done
    run replay_keys "$n"
    run pk_select_keys "$n"
  done
done

python3 - "$OUT" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, n, tps, kps = line.split("\t")
    runs.setdefault((name, int(n)), []).append(float(kps))
rows = {k: statistics.median(v) for k, v in runs.items()}  # medians of the repetitions
sizes = sorted({n for (_, n) in rows if n > 0})
print()
print("keys/s, medians (synchronous_commit = on)   " + "".join(f"{n:>10}" for n in sizes))
for name in ["claim_keys_v7", "floor_v7", "claim_keys_rand", "floor_rand", "replay_keys", "pk_select_keys"]:
    print(f"  {name:<42}" + "".join(f"{rows.get((name, n), 0):>10.0f}" for n in sizes))
for name in ["claim_key_v7", "claim_key_rand", "replay_key"]:
    print(f"  {name + ' (one per round trip)':<42}{rows[(name, 1)]:>10.0f}")
print()
print("ratios                                      " + "".join(f"{n:>10}" for n in sizes))
for label, a, b in [("claim_keys_v7 / claim_key_v7", "claim_keys_v7", "claim_key_v7"),
                    ("claim_keys_rand / claim_key_rand", "claim_keys_rand", "claim_key_rand"),
                    ("claim_keys_v7 / floor_v7", "claim_keys_v7", "floor_v7"),
                    ("claim_keys_rand / floor_rand", "claim_keys_rand", "floor_rand"),
                    ("replay_keys / replay_key", "replay_keys", "replay_key"),
                    ("replay_keys / pk_select_keys", "replay_keys", "pk_select_keys")]:
    cells = []
    for n in sizes:
        base = rows[(b, 1)] if b in ("claim_key_v7", "claim_key_rand", "replay_key") else rows.get((b, n))
        cells.append(f"{rows.get((a, n), 0) / base:>10.2f}" if base else f"{'-':>10}")
    print(f"  {label:<42}" + "".join(cells))
PY
fi

# Single claims of other sessions alone, then while one transaction claims 1,000,000 keys
# (and, for comparison, while one transaction INSERTs 1,000,000 rows into a plain table),
# while it stays open, and after its COMMIT; REPS repetitions, interleaved, medians.
MILLION="$IDEM_SCRATCH/million.tsv"
: >"$MILLION"
# p99_of LABEL: 2 clients' single claim_key calls for 8 seconds; appends "LABEL p99 p50 n".
p99_of() {
  local dir="$IDEM_SCRATCH/p99-$1-$rep"
  as_pg mkdir -p "$dir"
  as_pg pgbench -n -M prepared -c 2 -j 2 -T 8 -D n=1 -D nkeys="$NKEYS" -f "$HERE/batch/claim_key_v7.sql" \
    -l --log-prefix="$dir/tx" >/dev/null 2>&1 || idem_die "pgbench failed: p99 $1"
  python3 -c "
import glob
lat = sorted(int(l.split()[2]) for f in glob.glob('$dir/tx*') for l in open(f))
print(f'$1\t{lat[int(0.99 * len(lat))] / 1000:.3f}\t{lat[len(lat) // 2] / 1000:.3f}\t{len(lat)}')" | tee -a "$MILLION"
}
# big KIND SQL: a transaction that runs SQL, prints 'done', stays open (idle) for 12 s and
# commits; other sessions' claims are measured while SQL runs, while it is open, and after.
big() {
  pg_psql -At -c "BEGIN" -c "$2" -c "SELECT 'done'" -c "SELECT pg_sleep(12)" -c "COMMIT" >"$IDEM_SCRATCH/big.out" 2>&1 &
  big_pid=$!
  sleep 2
  p99_of "during-$1"
  until grep -qx done "$IDEM_SCRATCH/big.out"; do
    kill -0 "$big_pid" 2>/dev/null || { cat "$IDEM_SCRATCH/big.out" >&2; idem_die "the big transaction failed"; }
    sleep 0.5
  done
  p99_of "open-$1"
  wait "$big_pid" || { cat "$IDEM_SCRATCH/big.out" >&2; idem_die "the big transaction failed"; }
  p99_of "after-$1"
}
if want million; then
idem_log "1,000,000 claims in one transaction while other sessions claim ($REPS repetitions) ..."
for ((rep = 1; rep <= REPS; rep++)); do
  p99_of alone
  big claims "SELECT count(*) FROM claim_keys(ARRAY(SELECT 'million-$rep-' || g FROM generate_series(1, 1000000) g))"
  big floor "INSERT INTO floor_keys (owner, scope, key, fingerprint, attempts, ttl, lease, created_at, expires_at, lease_token, locked_until, status, updated_at)
     SELECT 10, '', 'million-$rep-' || g, bench_fp(), 1, '24 hours', '5 minutes', now(), now() + interval '24 hours', gen_uuid_v7(), now() + interval '5 minutes', 'processing', now()
       FROM generate_series(1, 1000000) g ON CONFLICT (owner, scope, key) DO NOTHING"
done
echo "single claim_key of 2 other sessions, p99 in ms, medians of $REPS (max_locks_per_transaction $(pg_psql -At -c 'SHOW max_locks_per_transaction')):"
python3 - "$MILLION" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    label, p99, p50, n = line.split("\t")
    runs.setdefault(label, []).append(float(p99))
alone = statistics.median(runs["alone"])
print(f"  alone                                                       {alone:7.2f}")
for kind, what in (("claims", "one transaction claims 1,000,000 keys (claim_keys)"),
                   ("floor", "one transaction INSERTs 1,000,000 rows (bare INSERT)")):
    for phase, when in (("during", "while " + what), ("open", "  while it stays open"),
                        ("after", "  after its COMMIT")):
        p = statistics.median(runs[f"{phase}-{kind}"])
        print(f"  {when:<58}{p:7.2f}  {p / alone:5.2f}x alone")
PY
fi

if want handoff; then
idem_log "wait handoff: $HANDOFFS handoffs ..."
for sync in on off; do
  /usr/bin/python3 "$HERE/wait_handoff.py" --dsn "host=$PGHOST port=$PGPORT dbname=postgres user=postgres" \
    --count "$HANDOFFS" --synchronous-commit "$sync"
done
fi
