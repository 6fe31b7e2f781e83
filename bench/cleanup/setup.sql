-- Helpers of bench/cleanup_bench.sh, installed in the benchmark database.

-- n expired keys, expiry increasing with insertion order (as created_at + ttl does).
CREATE FUNCTION bench_load_expired(n int) RETURNS void LANGUAGE sql AS $$
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at, status, response)
  SELECT 'expired-' || g, current_user, '1 hour', '5 minutes', now() - interval '3 hours',
         now() - interval '2 hours' + g * interval '1 us', now(), 'completed', '{"ok": true}'
    FROM generate_series(1, n) g
$$;

-- The reference: a hand-written batched delete, one transaction per batch.
CREATE PROCEDURE bench_delete_loop(batch int, INOUT deleted bigint DEFAULT 0)
LANGUAGE plpgsql AS $$
DECLARE
  n bigint;
BEGIN
  LOOP
    DELETE FROM idempotency_keys k
     USING (SELECT ctid FROM idempotency_keys WHERE expires_at <= now()
             LIMIT batch FOR UPDATE SKIP LOCKED) s
     WHERE k.ctid = s.ctid;
    GET DIAGNOSTICS n = ROW_COUNT;
    deleted := deleted + n;
    COMMIT;
    EXIT WHEN n < batch;
  END LOOP;
END $$;
