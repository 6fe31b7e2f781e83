-- pgTAP: idempotency.stuck_holders (issue #37): per role and scope, the live claims, the age of
-- the oldest, and the leases that ended with no take-over; counts and ages only. Readable by
-- superusers and, through idempotency_monitor, by members of pg_monitor; by no other role.
-- Roles are cluster-wide: they carry the prefix sh_ and are dropped at the end.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(10);

SELECT format('ALTER DATABASE %I SET idempotency.cleanup_worker = off', current_database()) \gexec
DO $$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sh_app') THEN CREATE ROLE sh_app; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'sh_mon') THEN CREATE ROLE sh_mon IN ROLE pg_monitor; END IF;
END$$;
GRANT USAGE ON SCHEMA idempotency TO sh_app;

-- sh_app's keys in scope 'pay': 200 live claims (the load), 3 whose lease ends at once, one
-- released, one completed; in scope 'mail': one live claim.
SET ROLE sh_app;
SELECT count(*) FROM idempotency.claim_keys(ARRAY(SELECT 'secret-live-' || i FROM generate_series(1, 200) i),
                                            scope => 'pay', lease => '1 hour');
SELECT count(*) FROM idempotency.claim_keys(ARRAY['secret-dead-1', 'secret-dead-2', 'secret-dead-3'],
                                            scope => 'pay', lease => '1 ms', ttl => '1 hour');
SELECT idempotency.release_key('secret-rel', (idempotency.claim_key('secret-rel', scope => 'pay')).token, 'pay');
SELECT idempotency.complete_key('secret-done', (idempotency.claim_key('secret-done', scope => 'pay')).token,
                                '{"card": "4242"}'::jsonb, scope => 'pay');
SELECT (idempotency.claim_key('secret-mail', scope => 'mail', lease => '1 hour')).status;
RESET ROLE;
DO $$BEGIN
  WHILE clock_timestamp() <= (SELECT max(locked_until) FROM idempotency.idempotency_keys
                               WHERE key LIKE 'secret-dead-%') LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END$$;

SELECT is((SELECT format('%s %s %s', role, processing, leases_ended) FROM idempotency.stuck_holders WHERE scope = 'pay'),
  'sh_app 200 3', 'per role and scope: live claims and leases ended without a take-over (released and completed not counted)');
SELECT is((SELECT format('%s %s %s', role, processing, leases_ended) FROM idempotency.stuck_holders WHERE scope = 'mail'),
  'sh_app 1 0', 'another scope is another row');
SELECT ok((SELECT oldest_claim_age > '0' AND oldest_claim_age < '1 hour' FROM idempotency.stuck_holders WHERE scope = 'pay'),
  'the oldest claim''s age');
SELECT is((SELECT datname::text FROM idempotency.stuck_holders WHERE scope = 'pay'), current_database()::text, 'this database');
SELECT is((SELECT array_agg(attname::text ORDER BY attnum) FROM pg_attribute
            WHERE attrelid = 'idempotency.stuck_holders'::regclass AND attnum > 0),
  ARRAY['datname', 'role', 'scope', 'processing', 'oldest_claim_age', 'leases_ended'],
  'its columns: no key, response or token');
SELECT is((SELECT count(*)::int FROM idempotency.stuck_holders s WHERE s::text LIKE '%secret%' OR s::text LIKE '%4242%'), 0,
  'no key value or response anywhere in its rows');

SET ROLE sh_mon;
SELECT is((SELECT sum(processing)::int FROM idempotency_monitor.stuck_holders), 201, 'pg_monitor reads idempotency_monitor.stuck_holders');
RESET ROLE;
SET ROLE sh_app;
SELECT throws_ok('SELECT * FROM idempotency_monitor.stuck_holders', '42501', NULL, 'an application role cannot read it');
SELECT throws_ok('SELECT * FROM idempotency.stuck_holders', '42501', NULL, 'nor the view in the extension''s schema');
RESET ROLE;
SET ROLE sh_mon;
SELECT throws_ok('SELECT * FROM idempotency.stuck_holders', '42501', NULL, 'pg_monitor has nothing in schema idempotency');
RESET ROLE;

SELECT * FROM finish();
DELETE FROM idempotency.idempotency_keys WHERE owner LIKE 'sh\_%';
REVOKE ALL ON SCHEMA idempotency FROM sh_app;
DROP ROLE sh_app;
DROP ROLE sh_mon;
SELECT format('ALTER DATABASE %I RESET idempotency.cleanup_worker', current_database()) \gexec
