-- Helpers of bench/cleanup_bench.sh, installed in the benchmark database.

-- n expired keys, expiry increasing with insertion order (as created_at + ttl does).
-- n keys, expired two hours ago; with live_share > 0, every live_share-th of them is instead a
-- live key with 30 days to go (mixed ttls, interleaved: issue #39), named live-<uuid> so that
-- the keys of each load differ and the benchmark's drains (of expired-%) keep them.
CREATE FUNCTION bench_load_expired(n int, live_share int DEFAULT 0) RETURNS void LANGUAGE sql AS $$
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at, status, response)
  SELECT CASE WHEN live THEN 'live-' || gen_random_uuid() ELSE 'expired-' || g END, current_user,
         CASE WHEN live THEN interval '30 days' ELSE interval '1 hour' END, '5 minutes',
         now() - interval '3 hours',
         CASE WHEN live THEN now() + interval '30 days' ELSE now() - interval '2 hours' + g * interval '1 us' END,
         now(), 'completed', '{"ok": true}'
    FROM generate_series(1, n) g, LATERAL (SELECT live_share > 0 AND g % live_share = 0 AS live) l
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
