-- idempotency_cleanup(batch_size): deletes exactly the expired keys, in batches of any
-- size, and returns how many. The test instance runs the background worker too: every
-- row is inserted and cleaned inside one transaction, which the worker cannot see, so the
-- counts below are the function's own.
SET client_min_messages = warning;

-- Rows written directly with chosen expiry times (superuser).
CREATE FUNCTION pg_temp.add_keys(prefix text, n int, expires timestamptz, step interval DEFAULT '0')
RETURNS void LANGUAGE sql AS $$
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT prefix || g, current_user, '1 hour', '5 min', now() - interval '2 hours', expires + g * step, now()
    FROM generate_series(1, n) g
$$;

BEGIN;
SELECT pg_temp.add_keys('expired-', 2500, now() - interval '1 hour', '1 ms');
SELECT pg_temp.add_keys('same-time-', 25, now() - interval '1 minute');  -- equal expires_at
SELECT pg_temp.add_keys('live-', 10, now() + interval '1 hour');
SELECT pg_temp.add_keys('far-', 3, 'infinity');
-- batches of 1000: three batches for 2525 rows, the last one short
SELECT idempotency_cleanup(1000) AS deleted;
SELECT regexp_replace(key, '[0-9]+$', '') AS kind, count(*) FROM idempotency_keys
 WHERE key ~ '^(expired|same-time|live|far)-' GROUP BY 1 ORDER BY 1;
-- nothing left to delete
SELECT idempotency_cleanup() AS deleted_again;
ROLLBACK;

-- batch_size 1 and batches smaller than a run of equal expiry times
BEGIN;
SELECT pg_temp.add_keys('same-time-', 25, now() - interval '1 minute');
SELECT idempotency_cleanup(10) AS deleted_in_batches_of_10;
SELECT pg_temp.add_keys('one-', 7, now() - interval '1 second', '1 us');
SELECT idempotency_cleanup(1) AS deleted_one_by_one;
ROLLBACK;

-- the boundary: expires_at <= now is expired, a key expiring in a second is live
BEGIN;
SELECT pg_temp.add_keys('edge-past-', 1, now() - interval '1 us');
SELECT pg_temp.add_keys('edge-future-', 1, clock_timestamp() + interval '1 second');
SELECT idempotency_cleanup() AS deleted;
SELECT key FROM idempotency_keys WHERE key LIKE 'edge-%';
ROLLBACK;

-- keys made by claim_key: a completed key is kept for its ttl, an expired one goes
BEGIN;
SELECT status FROM claim_key('cleanup-claimed', ttl => '1 hour');
SELECT status FROM claim_key('cleanup-short', ttl => '1 us', lease => '1 us');
SELECT pg_sleep(0.01);
SELECT idempotency_cleanup() AS deleted;
SELECT key FROM idempotency_keys WHERE key LIKE 'cleanup-%';
-- a key deleted by the cleanup is claimed afresh
SELECT status, attempts FROM claim_key('cleanup-short');
ROLLBACK;

-- the caller's search_path is never consulted
BEGIN;
SELECT pg_temp.add_keys('path-', 5, now() - interval '1 hour');
SET LOCAL search_path = pg_catalog;
SELECT idempotency.idempotency_cleanup() AS deleted_with_empty_search_path;
ROLLBACK;

-- keys of a dropped role go too, live or expired, in batches; other roles' live keys stay
BEGIN;
CREATE ROLE cleanup_regress_gone;
SELECT pg_temp.add_keys('live-', 3, now() + interval '1 hour');
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'orphan-' || g, 'cleanup_regress_gone', '1 hour', '5 min', now(),
         now() + CASE WHEN g % 2 = 0 THEN interval '1 hour' ELSE interval '-1 hour' END, now()
    FROM generate_series(1, 30) g;
DROP ROLE cleanup_regress_gone;
SELECT idempotency_cleanup(7) AS deleted_keys_of_dropped_role;
SELECT regexp_replace(key, '[0-9]+$', '') AS kind, count(*) FROM idempotency_keys
 WHERE key ~ '^(live|orphan)-' GROUP BY 1 ORDER BY 1;
ROLLBACK;

-- bad batch sizes (22023)
\set VERBOSITY sqlstate
SELECT idempotency_cleanup(0);
SELECT idempotency_cleanup(-5);
\set VERBOSITY default
SELECT idempotency_cleanup(0);

-- not granted to PUBLIC (42501), even to a role with USAGE on the schema; a role it is
-- granted to can run it
CREATE ROLE cleanup_regress_user;
GRANT USAGE ON SCHEMA idempotency TO cleanup_regress_user;
SET ROLE cleanup_regress_user;
\set VERBOSITY terse
SELECT idempotency_cleanup();
\set VERBOSITY default
RESET ROLE;
GRANT EXECUTE ON FUNCTION idempotency_cleanup(integer) TO cleanup_regress_user;
BEGIN;
SELECT pg_temp.add_keys('granted-', 4, now() - interval '1 hour');
SET LOCAL ROLE cleanup_regress_user;
SELECT idempotency_cleanup() AS deleted_by_granted_role;
ROLLBACK;
REVOKE EXECUTE ON FUNCTION idempotency_cleanup(integer) FROM cleanup_regress_user;
REVOKE USAGE ON SCHEMA idempotency FROM cleanup_regress_user;
DROP ROLE cleanup_regress_user;

-- the plan of the batch statement of src/cleanup.cpp (same text, operators unqualified):
-- an index scan in expiry order under the LIMIT, then a delete by TID,
-- whatever the table size
SET plan_cache_mode = force_generic_plan;
PREPARE batch(timestamptz, int, timestamptz) AS
WITH gone AS (DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM idempotency_keys WHERE expires_at >= $3 AND expires_at <= $1
   ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)) AND expires_at <= $1
  RETURNING expires_at)
SELECT count(*), max(expires_at) FROM gone;
EXPLAIN (COSTS OFF) EXECUTE batch(now(), 5000, '-infinity');
DEALLOCATE batch;
RESET plan_cache_mode;
