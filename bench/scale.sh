# shellcheck shell=bash
# The scale curve (bench/run.sh scale), sourced by bench/run.sh: claim throughput and
# table / index sizes as idempotency_keys grows, for keys from gen_uuid_v7() and for
# random text keys (client-made UUIDv4 strings), each in its own database.
#
# The table is grown with bulk INSERTs of rows as claim_key + complete_key store them
# (completed, with a response), which is much faster than claiming them one by one; at
# each step it is vacuumed (as autovacuum would), checkpointed, and then claims of new keys
# run with pgbench (synchronous_commit off: CPU and I/O cost, not commit flushes).
# SCALE_STEPS: millions of keys at which to measure (default "1 10"; "1 10 30" for 30M).
# SCALE_SECONDS: seconds of each of the 3 pgbench runs per step (median; default 5, 2 in
# QUICK mode).

run_scale() {
  local steps="${SCALE_STEPS:-1 10}" seconds="${SCALE_SECONDS:-5}"
  [[ $QUICK == 1 ]] && { steps="${SCALE_STEPS:-0.2 1}"; seconds="${SCALE_SECONDS:-2}"; }
  idem_log "scale: steps of $steps million keys, ${seconds}s of claims per step ..."
  : >"$OUT/scale.tsv"
  local source db have target step_rows workload tps sizes
  for source in v7 rand; do
    db="scale_$source"
    psql_q -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db" >/dev/null
    psql_q -d "$db" -c "CREATE EXTENSION idempotency" \
      -c "CREATE FUNCTION bench_fp() RETURNS bytea IMMUTABLE LANGUAGE sql
            AS \$\$ SELECT request_fingerprint('{\"amount\": 100, \"currency\": \"EUR\"}'::jsonb) \$\$" >/dev/null
    workload="claim_$source"
    have=0
    for step in $steps; do
      target="$(python3 -c "print(int(float('$step') * 1000000))")"
      # Grow in statements of at most 1M rows.
      while ((have < target)); do
        step_rows=$((target - have > 1000000 ? 1000000 : target - have))
        psql_q -d "$db" -c "
          INSERT INTO idempotency_keys (scope, key, owner, fingerprint, attempts, ttl, lease, created_at,
                                        expires_at, lease_token, locked_until, status,
                                        response_code, updated_at, response)
          SELECT '', $([[ $source == v7 ]] && echo 'gen_uuid_v7()::text' || echo 'gen_random_uuid()::text'),
                 'postgres', bench_fp(), 1, interval '24 hours', interval '5 minutes', now(),
                 now() + interval '24 hours', gen_uuid_v7(), now() + interval '5 minutes',
                 'completed', 200, now(), jsonb_build_object('status', 'ok', 'payment_id', n)
            FROM generate_series(1, $step_rows) n" >/dev/null
        have=$((have + step_rows))
      done
      psql_q -d "$db" -c "VACUUM ANALYZE idempotency_keys" -c "CHECKPOINT" >/dev/null
      # Three runs, median: one run is easily disturbed by other work on the machine.
      tps="$(for _ in 1 2 3; do
        as_pg env PGOPTIONS="-c synchronous_commit=off" pgbench -n -M prepared -c "$CLIENTS" \
          -j "$THREADS" -T "$seconds" -f "$BENCH_HERE/workloads/$workload.sql" "$db" 2>&1 |
          sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
      done | sort -n | sed -n 2p)"
      sizes="$(psql_q -d "$db" -F $'\t' -c "
        SELECT count(*), pg_relation_size('idempotency_keys'),
               pg_relation_size('idempotency_keys_pkey'),
               pg_relation_size('idempotency_keys_expires_at_idx'),
               current_setting('shared_buffers')
          FROM idempotency_keys")"
      printf '%s\t%s\t%s\t%s\n' "$source" "$step" "$tps" "$sizes" >>"$OUT/scale.tsv"
      idem_log "  $source: $step M keys: $tps claims/s"
    done
    psql_q -c "DROP DATABASE $db" >/dev/null
  done
  python3 "$BENCH_HERE/report.py" scale "$OUT/scale.tsv" "$seconds"
}
