-- pgTAP: idempotency_cleanup and idempotency_stats. idempotency_cleanup() deletes in a
-- background worker of its own and sees committed keys only, so the rows below are committed;
-- the cleanup worker of the test server is kept out of this database
-- (idempotency.cleanup_worker = off, read before and after every batch of it), so every count
-- is the function's own.
-- Edition: C++ only: the cleanup worker and the shared-memory statistics (the portable edition: portable_cleanup).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;
DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I SET idempotency.cleanup_worker = off', current_database());
END $$;

SELECT plan(62);

-------------------------------------------------------------------------------
-- The SQL surface
-------------------------------------------------------------------------------
SELECT has_function('idempotency', 'idempotency_cleanup', ARRAY['integer'], 'idempotency_cleanup(integer) exists');
SELECT function_returns('idempotency', 'idempotency_cleanup', ARRAY['integer'], 'bigint', 'it returns bigint');
SELECT isnt_definer('idempotency', 'idempotency_cleanup', ARRAY['integer'], 'it is SECURITY INVOKER');
SELECT ok(NOT has_function_privilege('public', 'idempotency.idempotency_cleanup(integer)', 'EXECUTE'),
          'PUBLIC may not run it');
SELECT ok(obj_description('idempotency.idempotency_cleanup(integer)'::regprocedure, 'pg_proc') ~ 'background worker of their own',
          'its comment says where the deletions run');
SELECT has_view('idempotency', 'idempotency_stats', 'the idempotency_stats view exists');
SELECT columns_are('idempotency', 'idempotency_stats', ARRAY[
  'datname', 'database', 'shared_memory', 'claimed', 'reclaimed', 'replayed', 'in_progress',
  'mismatched', 'completed', 'released', 'expired_deleted', 'cleanup_runs', 'last_cleanup',
  'last_cleanup_deleted', 'stats_since', 'last_error', 'note', 'orphan_passes', 'last_orphan_pass',
  'worker_start_failures', 'last_start_failure', 'forgotten'], 'idempotency_stats has its columns');
SELECT has_view('idempotency_monitor', 'idempotency_stats', 'idempotency_monitor.idempotency_stats exists');
SELECT columns_are('idempotency_monitor', 'idempotency_stats', ARRAY[
  'datname', 'database', 'shared_memory', 'claimed', 'reclaimed', 'replayed', 'in_progress',
  'mismatched', 'completed', 'released', 'expired_deleted', 'cleanup_runs', 'last_cleanup',
  'last_cleanup_deleted', 'stats_since', 'last_error', 'note', 'orphan_passes', 'last_orphan_pass',
  'worker_start_failures', 'last_start_failure', 'forgotten'], 'with the same columns');
SELECT ok(obj_description('idempotency.idempotency_stats'::regclass, 'pg_class') IS NOT NULL
          AND obj_description('idempotency_monitor.idempotency_stats'::regclass, 'pg_class') IS NOT NULL
          AND obj_description('idempotency_monitor'::regnamespace, 'pg_namespace') IS NOT NULL,
          'the views and the schema have comments');
SELECT is((SELECT count(*)::int FROM pg_depend d JOIN pg_extension e ON d.refobjid = e.oid
            WHERE e.extname = 'idempotency' AND d.deptype = 'e'
              AND ((d.classid = 'pg_namespace'::regclass AND d.objid = 'idempotency_monitor'::regnamespace)
                   OR (d.classid = 'pg_class'::regclass AND d.objid = 'idempotency_monitor.idempotency_stats'::regclass))),
          2, 'the schema and its view belong to the extension');
SELECT is((SELECT nspowner FROM pg_namespace WHERE nspname = 'idempotency_monitor'),
          (SELECT extowner FROM pg_extension WHERE extname = 'idempotency'),
          'the schema is owned by the installing superuser');
SELECT ok(has_table_privilege('pg_monitor', 'idempotency_monitor.idempotency_stats', 'SELECT')
          AND has_schema_privilege('pg_monitor', 'idempotency_monitor', 'USAGE'),
          'pg_monitor may read the statistics in idempotency_monitor');
SELECT ok(NOT has_schema_privilege('pg_monitor', 'idempotency', 'USAGE')
          AND NOT has_schema_privilege('pg_monitor', 'idempotency_monitor', 'CREATE'),
          'and has no USAGE on schema idempotency, nor CREATE on idempotency_monitor');
SELECT ok(NOT has_table_privilege('public', 'idempotency.idempotency_stats', 'SELECT')
          AND NOT has_table_privilege('public', 'idempotency_monitor.idempotency_stats', 'SELECT')
          AND NOT has_schema_privilege('public', 'idempotency_monitor', 'USAGE'),
          'PUBLIC may not');

-------------------------------------------------------------------------------
-- Arguments
-------------------------------------------------------------------------------
SELECT throws_ok('SELECT idempotency_cleanup(0)', '22023', 'batch_size must be positive', 'batch_size 0: 22023');
SELECT throws_ok('SELECT idempotency_cleanup(-1)', '22023', NULL, 'a negative batch_size: 22023');
SELECT is(idempotency_cleanup(NULL), 0::bigint, 'NULL takes idempotency.cleanup_batch_size');
SELECT is(idempotency_cleanup(), 0::bigint, 'nothing to delete: 0');

-------------------------------------------------------------------------------
-- Exactly the expired rows go, whatever the batch size
-------------------------------------------------------------------------------
CREATE FUNCTION add_random_keys(n int) RETURNS void LANGUAGE sql AS $$
  INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'r-' || g || '-' || md5(random()::text), current_user, '1 hour', '5 min', now() - interval '2 hours',
         clock_timestamp() + (random() - 0.5) * interval '2 hours', now()
    FROM generate_series(1, n) g
$$;
CREATE TEMP TABLE run (batch int, expected bigint, deleted bigint, left_expired bigint, live_before bigint, live_after bigint);
-- The keys are committed before the call, which sees committed keys only.
CREATE PROCEDURE one_run(batch int) LANGUAGE plpgsql AS $$
DECLARE
  t0 timestamptz;
  expected bigint;
  live bigint;
  deleted bigint;
BEGIN
  PERFORM add_random_keys(1000);
  COMMIT;
  t0 := clock_timestamp();
  SELECT count(*) FILTER (WHERE expires_at <= t0), count(*) FILTER (WHERE expires_at > t0 + interval '1 minute')
    INTO expected, live FROM idempotency_keys;
  deleted := idempotency_cleanup(batch);
  INSERT INTO run SELECT batch, expected, deleted,
    (SELECT count(*) FROM idempotency_keys WHERE expires_at <= t0),
    live,
    (SELECT count(*) FROM idempotency_keys WHERE expires_at > t0 + interval '1 minute');
  COMMIT;
END $$;
CALL one_run(1);
CALL one_run(7);
CALL one_run(100);
CALL one_run(999);
CALL one_run(1000);
CALL one_run(5000);
SELECT is(left_expired, 0::bigint, format('batch %s: no row expired before the call is left', batch))
  FROM run ORDER BY batch;
SELECT ok(deleted >= expected AND deleted <= expected + 50,
          format('batch %s: deleted %s, expired at the call %s (plus what expired during it)', batch, deleted, expected))
  FROM run ORDER BY batch;
SELECT is(live_after, live_before, format('batch %s: every row live a minute past the call stays', batch))
  FROM run ORDER BY batch;

-------------------------------------------------------------------------------
-- Keys made by the protocol
-------------------------------------------------------------------------------
DELETE FROM idempotency_keys;
SELECT is((claim_key('held', ttl => '1 us', lease => '1 hour')).status, 'claimed', 'a claim with a long lease');
SELECT is((claim_key('gone', ttl => '1 us', lease => '1 us')).status, 'claimed', 'a claim that expires at once');
SELECT pg_sleep(0.002);
SELECT is(idempotency_cleanup(), 1::bigint, 'one expired claim deleted');
SELECT is((SELECT array_agg(key) FROM idempotency_keys), ARRAY['held']::text[],
          'a processing key never expires while its lease runs');

-------------------------------------------------------------------------------
-- The calling transaction: the deletions are committed by the cleanup's worker
-------------------------------------------------------------------------------
DELETE FROM idempotency_keys;
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'c-' || g, current_user, '1 hour', '5 min', now(), now() - interval '1 hour', now() FROM generate_series(1, 6) g;
BEGIN;
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'u-' || g, current_user, '1 hour', '5 min', now(), now() - interval '1 hour', now() FROM generate_series(1, 4) g;
SELECT is(idempotency_cleanup(), 6::bigint, 'a call in an open transaction deletes the committed expired keys');
SELECT is((SELECT count(*) FROM idempotency_keys WHERE key LIKE 'u-%'), 4::bigint,
          'not those the calling transaction wrote and has not committed');
ROLLBACK;
SELECT is((SELECT count(*) FROM idempotency_keys), 0::bigint, 'and a rollback of the caller does not bring them back');
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT is(idempotency_cleanup(), 0::bigint, 'a call in a SERIALIZABLE transaction works too');
COMMIT;
BEGIN READ ONLY;
SELECT throws_ok('SELECT idempotency_cleanup()', '25006', NULL, 'a read-only transaction is refused (25006)');
ROLLBACK;

-------------------------------------------------------------------------------
-- Statistics
-------------------------------------------------------------------------------
SELECT ok((SELECT shared_memory FROM idempotency_stats WHERE datname = current_database()),
          'the test server preloads the library: shared counters exist');
CREATE TEMP TABLE s0 AS SELECT * FROM idempotency_stats WHERE datname = current_database();
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 's-' || g, current_user, '1 hour', '5 min', now(), now() - interval '1 hour', now() FROM generate_series(1, 77) g;
SELECT is(idempotency_cleanup(10), 77::bigint, '77 expired keys deleted in batches of 10');
SELECT is((SELECT s.expired_deleted - s0.expired_deleted FROM idempotency_stats s, s0
            WHERE s.datname = current_database()), 77::bigint, 'expired_deleted grew by 77');
SELECT is((SELECT s.cleanup_runs - s0.cleanup_runs FROM idempotency_stats s, s0
            WHERE s.datname = current_database()), 1::bigint, 'cleanup_runs grew by one');
SELECT ok((SELECT s.last_cleanup >= s0.stats_since FROM idempotency_stats s, s0
            WHERE s.datname = current_database()), 'last_cleanup is set');
SELECT is((SELECT claim_key('stats-a')).status, 'claimed', 'a claim');
SELECT is((SELECT s.claimed - s0.claimed FROM idempotency_stats s, s0 WHERE s.datname = current_database()),
          1::bigint, 'counted once in claimed');
SELECT is((SELECT (worker_start_failures, last_start_failure)::text FROM idempotency_stats WHERE datname = current_database()),
          '(0,)', 'no cleanup worker failed to start');

-------------------------------------------------------------------------------
-- Keys of a dropped role go, live or not, in batches; the other roles' live keys stay.
-- (How many orphan passes ran is not asserted here: the server's own cleanup worker
-- makes passes too, at times this file does not control.)
-------------------------------------------------------------------------------
DELETE FROM idempotency_keys;
SELECT idempotency_cleanup();
CREATE TEMP TABLE p0 AS SELECT orphan_passes FROM idempotency_stats WHERE datname = current_database();
SELECT is(idempotency_cleanup(), 0::bigint, 'a cleanup with no role changed since the last');
CREATE ROLE tap_cleanup_gone;
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'o-' || g, 'tap_cleanup_gone', '1 hour', '5 min', now(), now() + interval '1 hour', now()
    FROM generate_series(1, 23) g;
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'l-' || g, current_user, '1 hour', '5 min', now(), now() + interval '1 hour', now() FROM generate_series(1, 5) g;
SELECT is(idempotency_cleanup(4), 0::bigint, 'while the role exists its live keys stay');
DROP ROLE tap_cleanup_gone;
SELECT is(idempotency_cleanup(4), 23::bigint, 'once it is dropped, its 23 keys are deleted (batches of 4)');
SELECT is((SELECT count(*) FROM idempotency_keys WHERE key LIKE 'l-%'), 5::bigint, 'the live keys of other roles stay');

-------------------------------------------------------------------------------
-- The extension dropped and created again (its schema stays; a new table): the
-- backend's prepared statement is for the old table and must not be used. Inside the
-- transaction that did it, the cleanup (which sees only what is committed) refuses.
-------------------------------------------------------------------------------
DELETE FROM idempotency_keys;
CREATE TEMP TABLE old_table AS SELECT 'idempotency.idempotency_keys'::regclass::oid AS oid;
BEGIN;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT throws_ok('SELECT idempotency.idempotency_cleanup()', '55000', NULL,
                 'in the transaction that created the extension again: 55000');
ROLLBACK;
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
SELECT isnt((SELECT oid FROM old_table), 'idempotency.idempotency_keys'::regclass::oid, 'a new table');
INSERT INTO idempotency.idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'n-' || g, current_user, '1 hour', '5 min', now(), now() - interval '1 hour', now() FROM generate_series(1, 12) g;
SELECT is(idempotency.idempotency_cleanup(5), 12::bigint, 'cleanup after DROP and CREATE EXTENSION deletes from the new table');
SELECT is((SELECT count(*) FROM idempotency.idempotency_keys), 0::bigint, 'which is empty afterwards');

SELECT * FROM finish();
DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I RESET idempotency.cleanup_worker', current_database());
END $$;
