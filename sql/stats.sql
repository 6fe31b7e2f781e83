-- idempotency_stats: per-database counters in shared memory (the test instance preloads
-- the library). Counters are compared before and after, so that earlier tests do not change
-- the output; the background worker is kept out of this database
-- (idempotency.cleanup_worker = off), so that the cleanup counts are idempotency_cleanup()'s.
SET client_min_messages = warning;
DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I SET idempotency.cleanup_worker = off', current_database());
END $$;

\d idempotency_stats
-- the same columns for monitoring roles
SELECT (SELECT array_agg(attname ORDER BY attnum) FROM pg_attribute
         WHERE attrelid = 'idempotency_monitor.idempotency_stats'::regclass AND attnum > 0)
     = (SELECT array_agg(attname ORDER BY attnum) FROM pg_attribute
         WHERE attrelid = 'idempotency.idempotency_stats'::regclass AND attnum > 0) AS same_columns;

-- a database gets its row with its first count: a claim
SELECT status FROM claim_key('stats-0');
SELECT shared_memory, note, stats_since <= now() AS since_ok
  FROM idempotency_stats WHERE datname = current_database();

CREATE TEMP TABLE before AS SELECT * FROM idempotency_stats WHERE datname = current_database();
CREATE FUNCTION pg_temp.delta() RETURNS TABLE (counter text, delta bigint) LANGUAGE sql AS $$
  SELECT c.counter, c.now - c.before
    FROM idempotency_stats s, before b,
         LATERAL (VALUES ('claimed', s.claimed, b.claimed), ('reclaimed', s.reclaimed, b.reclaimed),
                         ('replayed', s.replayed, b.replayed), ('in_progress', s.in_progress, b.in_progress),
                         ('mismatched', s.mismatched, b.mismatched), ('completed', s.completed, b.completed),
                         ('released', s.released, b.released)) AS c(counter, now, before)
   WHERE s.datname = current_database()
$$;

-- one of each outcome
SELECT token AS t1 FROM claim_key('stats-1', request_fingerprint('a'::text)) \gset
SELECT status FROM claim_key('stats-1', request_fingerprint('a'::text));          -- in_progress
SELECT status FROM complete_key('stats-1', :'t1', '{"ok": true}', 200);           -- completed
SELECT status FROM claim_key('stats-1', request_fingerprint('a'::text));          -- replay
SELECT status FROM claim_key('stats-1', request_fingerprint('a'::text));          -- replay
SELECT status FROM claim_key('stats-1', request_fingerprint('b'::text));          -- mismatch
SELECT token AS t2 FROM claim_key('stats-2') \gset
SELECT release_key('stats-2', :'t2');                                              -- released
SELECT status FROM claim_key('stats-2');                                           -- reclaimed
SELECT * FROM pg_temp.delta() ORDER BY counter;

-- a claim rolled back still counts (the counters are not transactional)
BEGIN;
SELECT status FROM claim_key('stats-3');
ROLLBACK;
SELECT delta FROM pg_temp.delta() WHERE counter = 'claimed';

-- cleanup: expired_deleted grows by what idempotency_cleanup deleted, and the run is
-- recorded; the pass over keys of dropped roles runs after a role was dropped (orphan_passes)
CREATE TEMP TABLE before_cleanup AS
  SELECT expired_deleted, cleanup_runs, orphan_passes FROM idempotency_stats WHERE datname = current_database();
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'stats-old-' || g, current_user, '1 hour', '5 min', now() - interval '2 hours', now() - interval '1 hour', now()
    FROM generate_series(1, 42) g;
CREATE ROLE stats_regress_gone;
DROP ROLE stats_regress_gone;
SELECT idempotency_cleanup() AS deleted;
SELECT s.expired_deleted - b.expired_deleted AS deleted_counted,
       s.cleanup_runs - b.cleanup_runs AS runs_counted,
       s.orphan_passes > b.orphan_passes AS orphan_pass_counted,
       s.last_cleanup > now() - interval '1 minute' AS last_cleanup_recent,
       s.last_orphan_pass > now() - interval '1 minute' AS last_orphan_pass_recent,
       s.worker_start_failures AS start_failures, s.last_start_failure
  FROM idempotency_stats s, before_cleanup b WHERE s.datname = current_database();

-- a failing cleanup is recorded in last_error, and a successful one clears it
CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql
  AS $$ BEGIN RAISE EXCEPTION 'no deletions today'; END $$;
CREATE TRIGGER refuse BEFORE DELETE ON idempotency_keys
  FOR EACH ROW EXECUTE FUNCTION refuse_delete();
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  VALUES ('stats-stuck', current_user, '1 hour', '5 min', now() - interval '2 hours', now() - interval '1 hour', now());
\set VERBOSITY terse
SELECT idempotency_cleanup();
\set VERBOSITY default
SELECT last_error FROM idempotency_stats WHERE datname = current_database();
DROP TRIGGER refuse ON idempotency_keys;
DROP FUNCTION refuse_delete();
SELECT idempotency_cleanup() AS deleted_once_allowed;
SELECT last_error FROM idempotency_stats WHERE datname = current_database();
SELECT count(*) FROM idempotency_keys WHERE key = 'stats-stuck';

-- for superusers and members of pg_monitor, like pg_stat_* (42501 for others)
-- (without USAGE on the schema, and with it: the view and its function stay refused)
CREATE ROLE stats_regress_user;
SET ROLE stats_regress_user;
\set VERBOSITY terse
SELECT count(*) FROM idempotency.idempotency_stats;
SELECT count(*) FROM idempotency_monitor.idempotency_stats;
RESET ROLE;
GRANT USAGE ON SCHEMA idempotency TO stats_regress_user;
SET ROLE stats_regress_user;
SELECT count(*) FROM idempotency.idempotency_stats;
SELECT count(*) FROM idempotency.idempotency_stats_rows();
\set VERBOSITY default
RESET ROLE;
REVOKE USAGE ON SCHEMA idempotency FROM stats_regress_user;

-- a member of pg_monitor reads the statistics in schema idempotency_monitor, and nothing
-- else: no USAGE on schema idempotency, so no claim_key (42501) and no key table (42501)
GRANT pg_monitor TO stats_regress_user;
SELECT has_schema_privilege('pg_monitor', 'idempotency', 'USAGE') AS monitor_usage_on_idempotency,
       has_schema_privilege('pg_monitor', 'idempotency_monitor', 'USAGE') AS monitor_usage_on_monitor,
       has_schema_privilege('pg_monitor', 'idempotency_monitor', 'CREATE') AS monitor_create_on_monitor,
       has_table_privilege('pg_monitor', 'idempotency_monitor.idempotency_stats', 'SELECT') AS monitor_select,
       has_schema_privilege('public', 'idempotency_monitor', 'USAGE') AS public_usage_on_monitor;
SET ROLE stats_regress_user;
SELECT count(*) >= 1 AS visible FROM idempotency_monitor.idempotency_stats WHERE datname = current_database();
\set VERBOSITY sqlstate
SELECT idempotency.claim_key('stats-monitor');
SELECT count(*) FROM idempotency.idempotency_keys;
SELECT count(*) FROM idempotency.idempotency_stats;
\set VERBOSITY terse
SELECT idempotency.claim_key('stats-monitor');
SELECT count(*) FROM idempotency.idempotency_keys;
\set VERBOSITY default
RESET ROLE;
SELECT count(*) AS keys_written_by_the_monitoring_role FROM idempotency_keys WHERE key = 'stats-monitor';
DROP ROLE stats_regress_user;
DELETE FROM idempotency_keys WHERE key LIKE 'stats-%';
DO $$ BEGIN
  EXECUTE format('ALTER DATABASE %I RESET idempotency.cleanup_worker', current_database());
END $$;
