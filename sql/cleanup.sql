-- idempotency_cleanup(batch_size): deletes exactly the expired keys (and the keys of dropped
-- roles), in batches of any size, and returns how many. Its deletions run in a background
-- worker of their own and commit there: it sees committed keys only. The test instance runs
-- the cleanup worker too; idempotency.cleanup_worker = off for this database keeps it out
-- (it reads the setting before and after every batch, so rows committed after the ALTER are
-- never touched by it), and the counts below are the function's own.
SET client_min_messages = warning;
DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I SET idempotency.cleanup_worker = off', current_database());
END $$;

-- Rows written directly with chosen expiry times (superuser).
CREATE FUNCTION pg_temp.add_keys(prefix text, n int, expires timestamptz, step interval DEFAULT '0')
RETURNS void LANGUAGE sql AS $$
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT prefix || g, current_user, '1 hour', '5 min', now() - interval '2 hours', expires + g * step, now()
    FROM generate_series(1, n) g
$$;

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
DELETE FROM idempotency_keys;

-- batch_size 1 and batches smaller than a run of equal expiry times
SELECT pg_temp.add_keys('same-time-', 25, now() - interval '1 minute');
SELECT idempotency_cleanup(10) AS deleted_in_batches_of_10;
SELECT pg_temp.add_keys('one-', 7, now() - interval '1 second', '1 us');
SELECT idempotency_cleanup(1) AS deleted_one_by_one;

-- the boundary: expires_at <= now is expired, a key expiring in a second is live
SELECT pg_temp.add_keys('edge-past-', 1, now() - interval '1 us');
SELECT pg_temp.add_keys('edge-future-', 1, clock_timestamp() + interval '1 second');
SELECT idempotency_cleanup() AS deleted;
SELECT key FROM idempotency_keys WHERE key LIKE 'edge-%';
DELETE FROM idempotency_keys;

-- keys made by claim_key: a completed key is kept for its ttl, an expired one goes
SELECT status FROM claim_key('cleanup-claimed', ttl => '1 hour');
SELECT status FROM claim_key('cleanup-short', ttl => '1 us', lease => '1 us');
SELECT pg_sleep(0.01);
SELECT idempotency_cleanup() AS deleted;
SELECT key FROM idempotency_keys WHERE key LIKE 'cleanup-%';
-- a key deleted by the cleanup is claimed afresh
SELECT status, attempts FROM claim_key('cleanup-short');
DELETE FROM idempotency_keys;

-- the calling transaction: its rollback does not bring the keys back (the deletions
-- committed in the cleanup's worker), and keys it wrote itself and has not committed are not
-- seen (test/isolation/specs/cleanup_open_transaction.spec: it blocks no claim meanwhile)
SELECT pg_temp.add_keys('committed-', 5, now() - interval '1 hour');
BEGIN;
SELECT pg_temp.add_keys('uncommitted-', 3, now() - interval '1 hour');
SELECT idempotency_cleanup() AS deleted_committed_only;
SELECT regexp_replace(key, '[0-9]+$', '') AS kind, count(*) FROM idempotency_keys GROUP BY 1;
ROLLBACK;
SELECT count(*) AS left_after_rollback FROM idempotency_keys;

-- the caller's search_path is never consulted
SELECT pg_temp.add_keys('path-', 5, now() - interval '1 hour');
BEGIN;
SET LOCAL search_path = pg_catalog;
SELECT idempotency.idempotency_cleanup() AS deleted_with_empty_search_path;
COMMIT;

-- keys of a dropped role go too, live or expired, in batches; other roles' live keys stay
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
-- and a renamed role's: the keys name the old name, which no role has now
CREATE ROLE cleanup_regress_old;
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'renamed-' || g, 'cleanup_regress_old', '1 hour', '5 min', now(), now() + interval '1 hour', now()
    FROM generate_series(1, 4) g;
SELECT idempotency_cleanup() AS deleted_while_the_role_exists;
ALTER ROLE cleanup_regress_old RENAME TO cleanup_regress_new;
SELECT idempotency_cleanup() AS deleted_after_the_rename;
DROP ROLE cleanup_regress_new;
DELETE FROM idempotency_keys;

-- bad batch sizes (22023)
\set VERBOSITY sqlstate
SELECT idempotency_cleanup(0);
SELECT idempotency_cleanup(-5);
-- a write, refused in a read-only transaction (25006)
BEGIN READ ONLY;
SELECT idempotency_cleanup();
ROLLBACK;
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
SELECT pg_temp.add_keys('granted-', 4, now() - interval '1 hour');
SET ROLE cleanup_regress_user;
SELECT idempotency_cleanup() AS deleted_by_granted_role;
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idempotency_cleanup(integer) FROM cleanup_regress_user;
REVOKE USAGE ON SCHEMA idempotency FROM cleanup_regress_user;
DROP ROLE cleanup_regress_user;

-- the plan of the batch statement of src/cleanup_statements.cpp (same text, operators unqualified):
-- under the B-Tree of PostgreSQL 15, an index scan in expiry order under the LIMIT, then a
-- delete by TID, whatever the table size; under the BRIN of 16 and later, the statement
-- without ORDER BY: the first expired keys in block order under the LIMIT (no sort of every
-- expired key), then the delete by TID; it returns the largest ctid deleted, where the next
-- batch starts
SET plan_cache_mode = force_generic_plan;
SELECT amname = 'brin' AS expiry_brin FROM pg_class JOIN pg_am ON pg_am.oid = relam
 WHERE pg_class.oid = 'idempotency_keys_expires_at_idx'::regclass \gset
\if :expiry_brin
PREPARE batch(timestamptz, int, timestamptz) AS
WITH gone AS (DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM idempotency_keys WHERE expires_at >= $3 AND expires_at <= $1
     AND idempotency.expiry_bucket(expires_at) <= $1
   LIMIT $2 FOR UPDATE SKIP LOCKED)) AND expires_at <= $1
  RETURNING ctid)
SELECT count(*), max(ctid) FROM gone;
\else
PREPARE batch(timestamptz, int, timestamptz) AS
WITH gone AS (DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM idempotency_keys WHERE expires_at >= $3 AND expires_at <= $1
   ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED)) AND expires_at <= $1
  RETURNING expires_at)
SELECT count(*), max(expires_at) FROM gone;
\endif
EXPLAIN (COSTS OFF) EXECUTE batch(now(), 5000, '-infinity');
DEALLOCATE batch;
-- and of the batch of keys of dropped roles: a range of blocks read by a TID range scan,
-- each key's owner looked up in pg_authid, never a scan of the whole table (the shape, not
-- the join, which depends on the number of roles)
PREPARE orphans(tid, tid, int) AS
WITH gone AS (DELETE FROM idempotency_keys k WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM idempotency_keys k WHERE ctid >= $1 AND ctid < $2
     AND NOT EXISTS (SELECT FROM pg_authid a WHERE a.rolname = k.owner)
   LIMIT $3 FOR UPDATE SKIP LOCKED))
     AND NOT EXISTS (SELECT FROM pg_authid a WHERE a.rolname = k.owner)
  RETURNING 1)
SELECT count(*) FROM gone;
CREATE FUNCTION pg_temp.plan_of(statement text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE line text;
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || statement LOOP RETURN NEXT line; END LOOP;
END $$;
SELECT count(*) FILTER (WHERE line ~ 'Tid Range Scan on idempotency_keys') AS tid_range_scans,
       count(*) FILTER (WHERE line ~ 'Tid Scan on idempotency_keys') AS tid_scans,
       count(*) FILTER (WHERE line ~ '(Seq|Index|Bitmap).* on idempotency_keys') AS other_scans
  FROM pg_temp.plan_of($$EXECUTE orphans('(0,0)', '(156,0)', 5000)$$) line;
DEALLOCATE orphans;
-- under the BRIN, the batches after a run's first: from the block where the last one stopped,
-- by a TID range scan that stops at the LIMIT (not the BRIN's bitmap, which would read every
-- candidate range from block 0 again: quadratic over a run)
PREPARE range_batch(tid, tid, timestamptz, int) AS
WITH gone AS (DELETE FROM idempotency_keys WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM idempotency_keys WHERE ctid >= $1 AND ctid < $2 AND expires_at <= $3
   LIMIT $4 FOR UPDATE SKIP LOCKED)) AND expires_at <= $3
  RETURNING ctid)
SELECT count(*), max(ctid) FROM gone;
SELECT count(*) FILTER (WHERE line ~ 'Tid Range Scan on idempotency_keys') AS tid_range_scans,
       count(*) FILTER (WHERE line ~ 'Tid Scan on idempotency_keys') AS tid_scans,
       count(*) FILTER (WHERE line ~ '(Seq|Index|Bitmap).* on idempotency_keys') AS other_scans
  FROM pg_temp.plan_of($$EXECUTE range_batch('(7,0)', '(4294967295,0)', now(), 5000)$$) line;
DEALLOCATE range_batch;
RESET plan_cache_mode;

DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I RESET idempotency.cleanup_worker', current_database());
END $$;
