-- idempotency_stats: per-database counters in shared memory (the test instance preloads
-- the library). Counters are compared before and after, so that earlier tests and the
-- background worker (which adds cleanup runs on its own) do not change the output.
SET client_min_messages = warning;

\d idempotency_stats

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

-- cleanup: expired_deleted grows by what idempotency_cleanup deleted (at least: the worker
-- may delete other keys meanwhile), and the run is recorded
CREATE TEMP TABLE before_cleanup AS
  SELECT expired_deleted, cleanup_runs FROM idempotency_stats WHERE datname = current_database();
BEGIN;
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  SELECT 'stats-old-' || g, 10, '1 hour', '5 min', now() - interval '2 hours', now() - interval '1 hour', now()
    FROM generate_series(1, 42) g;
SELECT idempotency_cleanup() AS deleted;
COMMIT;
SELECT s.expired_deleted - b.expired_deleted >= 42 AS deleted_counted,
       s.cleanup_runs > b.cleanup_runs AS run_counted,
       s.last_cleanup > now() - interval '1 minute' AS last_cleanup_recent
  FROM idempotency_stats s, before_cleanup b WHERE s.datname = current_database();

-- a failing cleanup is recorded in last_error (the worker fails the same way meanwhile),
-- and a successful one clears it
CREATE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql
  AS $$ BEGIN RAISE EXCEPTION 'no deletions today'; END $$;
CREATE TRIGGER refuse BEFORE DELETE ON idempotency_keys
  FOR EACH ROW EXECUTE FUNCTION refuse_delete();
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at)
  VALUES ('stats-stuck', 10, '1 hour', '5 min', now() - interval '2 hours', now() - interval '1 hour', now());
\set VERBOSITY terse
SELECT idempotency_cleanup();
\set VERBOSITY default
SELECT last_error FROM idempotency_stats WHERE datname = current_database();
DROP TRIGGER refuse ON idempotency_keys;
DROP FUNCTION refuse_delete();
-- A worker round that failed just before the DROP may record its error after our
-- success: clean until a success is the last word (at most a few tries).
DO $$
BEGIN
  FOR i IN 1..50 LOOP
    PERFORM idempotency_cleanup();
    EXIT WHEN (SELECT last_error IS NULL FROM idempotency_stats WHERE datname = current_database());
    PERFORM pg_sleep(0.1);
  END LOOP;
END $$;
SELECT last_error FROM idempotency_stats WHERE datname = current_database();
SELECT count(*) FROM idempotency_keys WHERE key = 'stats-stuck';

-- for superusers and pg_monitor members, like pg_stat_* (42501 for others)
-- (without USAGE on the schema, and with it: the view and its function stay refused)
CREATE ROLE stats_regress_user;
SET ROLE stats_regress_user;
\set VERBOSITY terse
SELECT count(*) FROM idempotency.idempotency_stats;
RESET ROLE;
GRANT USAGE ON SCHEMA idempotency TO stats_regress_user;
SET ROLE stats_regress_user;
SELECT count(*) FROM idempotency.idempotency_stats;
SELECT count(*) FROM idempotency.idempotency_stats_rows();
\set VERBOSITY default
RESET ROLE;
REVOKE USAGE ON SCHEMA idempotency FROM stats_regress_user;
GRANT pg_monitor TO stats_regress_user;
SET ROLE stats_regress_user;
SELECT count(*) >= 1 AS visible FROM idempotency.idempotency_stats WHERE datname = current_database();
RESET ROLE;
DROP ROLE stats_regress_user;
DELETE FROM idempotency_keys WHERE key LIKE 'stats-%';
