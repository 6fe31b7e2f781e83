# shellcheck shell=bash
# The claim path's profile (bench/run.sh profile), sourced by bench/run.sh: one backend
# runs a workload from one pgbench client (synchronous_commit off, so that commit flushes
# do not hide CPU), `perf record` samples it (cpu-clock: virtual machines often have no
# hardware counters), and the report lists where the time goes, inclusive, for the
# stages of a statement and for our own functions.
# Needs perf (Debian: linux-perf). PROFILE_WORKLOADS (default "floor_v7 claim_v7 inbox
# replay pk_select"), PROFILE_SECONDS (default 10; 4 in QUICK mode).

# Inclusive shares printed for every workload (symbols of postgres and of idempotency.so).
PROFILE_SYMBOLS=(
  exec_bind_message exec_execute_message PortalRun PortalStart
  ExecMakeTableFunctionResult fmgr_security_definer SPI_execute_plan _SPI_execute_plan
  GetCachedPlan standard_ExecutorStart standard_ExecutorRun standard_ExecutorEnd
  ExecInitModifyTable ExecInitIndexScan ExecInsert ExecUpdate heap_insert heap_update
  simple_heap_update heap_fetch index_insert
  _bt_doinsert _bt_first index_getnext_slot ExecCheckIndexConstraints LockAcquireExtended
  LockRelease heap_form_tuple BlessTupleDesc GetSnapshotData CommandCounterIncrement
  CommitTransactionCommand StartTransactionCommand XLogInsertRecord pq_getbyte
  socket_flush jsonb_in
)

run_profile() {
  command -v perf >/dev/null || { echo "profile: perf is missing (apt-get install linux-perf)"; return 0; }
  local workloads="${PROFILE_WORKLOADS:-floor_v7 claim_v7 inbox replay pk_select}"
  local seconds="${PROFILE_SECONDS:-10}"
  [[ $QUICK == 1 ]] && seconds="${PROFILE_SECONDS:-4}"
  local name pid data pgb tps
  echo "Profile: one pgbench client, synchronous_commit off, perf record -e cpu-clock -g on its backend, ${seconds}s each"
  for name in $workloads; do
    data="$OUT/perf-$name.data"
    pgb="$OUT/perf-$name.pgbench"
    as_pg env PGOPTIONS="-c synchronous_commit=off" PGAPPNAME=bench_profile \
      pgbench -n -M prepared -c 1 -T "$((seconds + 3))" -D nkeys="$NKEYS" \
      -f "$BENCH_HERE/workloads/$name.sql" >"$pgb" 2>&1 &
    local bg=$!
    pid=""
    for _ in $(seq 50); do
      pid="$(psql_q -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'bench_profile' AND pid <> pg_backend_pid()")"
      [[ -n $pid ]] && break
      sleep 0.1
    done
    [[ -n $pid ]] || { wait "$bg"; echo "profile: no backend for $name"; continue; }
    sleep 1
    perf record -q -e cpu-clock -F 4000 -g -p "$pid" -o "$data" -- sleep "$seconds" >/dev/null 2>&1 || true
    wait "$bg" || true
    tps="$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$pgb")"
    echo
    echo "### $name: $tps tx/s from one client ($(python3 -c "print('%.1f' % (1e6 / float('${tps:-0}' or 'inf')))" 2>/dev/null) us per transaction, client included)"
    perf report -i "$data" --children --sort symbol -g none --stdio 2>/dev/null >"$data.children.txt" || true
    perf report -i "$data" --no-children --sort dso,symbol -g none --stdio 2>/dev/null >"$data.self.txt" || true
    python3 "$BENCH_HERE/report.py" profile "$data.children.txt" "$data.self.txt" "${PROFILE_SYMBOLS[@]}"
  done
  echo
  echo "(perf data and full reports: $OUT/perf-*)"
}
