-- pgTAP: every function of the extension refuses to run inside a security-restricted
-- operation (SPEC section 7, issue #22): called from an index expression (evaluated by
-- CREATE INDEX as the table's owner) or from a materialized view's query (REFRESH
-- MATERIALIZED VIEW), each fails with 42501 and changes nothing, although the same call
-- succeeds outside (the calls use live tokens and keys that they would change).
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed.
-- On every path: run as it is and with the table on the executor path
-- (test/paths/executor.setup.sql); the result lines must be the same.
-- Edition: C++ only: its refusal inside security-restricted operations (the portable edition: SECURITY.md).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(26);

CREATE SCHEMA sro;
-- The calls, by name; each would change a key (or delete an expired one) if it ran.
CREATE TABLE sro.calls (name text PRIMARY KEY, sql text NOT NULL);
-- Runs the call `name`; lies about being IMMUTABLE so that an index may use it.
CREATE FUNCTION sro.run(name text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE call text;
BEGIN
  SELECT c.sql INTO STRICT call FROM sro.calls c WHERE c.name = run.name;
  EXECUTE call;
  RETURN name;
END $$;
-- All keys in one comparable string (but the expired one, which the cleanup worker of the
-- test server may delete at any time).
CREATE FUNCTION sro.keys() RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(format('%s:%s:%s:%s:%s:%s', key, status, attempts, lease_token, coalesce(recovery_point, '-'),
                           coalesce(response::text, '-')), ' ' ORDER BY key)
    FROM idempotency.idempotency_keys WHERE key <> 'sro-expired' $$;

-- A held claim (committed: the two-phase pattern) for the fenced calls, and an expired key
-- for the cleanup.
CREATE TEMP TABLE held AS SELECT token FROM claim_key('sro-held', lease => '1 hour');
INSERT INTO idempotency.idempotency_keys (owner, scope, key, attempts, ttl, lease, created_at, expires_at, updated_at, status)
  VALUES (current_user, '', 'sro-expired', 1, '1 hour', '1 min', now() - interval '2 hours', now() - interval '1 hour',
          now() - interval '1 hour', 'completed');
INSERT INTO sro.calls VALUES
  ('claim_key', $$SELECT idempotency.claim_key('sro-new')$$),
  ('claim_keys', $$SELECT * FROM idempotency.claim_keys(ARRAY['sro-new-batch'])$$),
  ('complete_key', format($$SELECT idempotency.complete_key('sro-held', %L, '{"sro": true}')$$, (SELECT token FROM held))),
  ('complete_keys', format($$SELECT * FROM idempotency.complete_keys(ARRAY['sro-held'], ARRAY[%L]::uuid[], ARRAY['{"sro": true}']::jsonb[])$$,
                           (SELECT token FROM held))),
  ('release_key', format($$SELECT idempotency.release_key('sro-held', %L)$$, (SELECT token FROM held))),
  ('checkpoint_key', format($$SELECT idempotency.checkpoint_key('sro-held', %L, 'sro-step')$$, (SELECT token FROM held))),
  ('idempotency_cleanup', $$SELECT idempotency.idempotency_cleanup()$$);
CREATE TEMP TABLE before AS SELECT sro.keys() AS keys;

-- Inside REFRESH MATERIALIZED VIEW: 42501 from the function itself, nothing changed.
DO $$
DECLARE f text;
BEGIN
  FOR f IN SELECT name FROM sro.calls ORDER BY name LOOP
    EXECUTE format('CREATE MATERIALIZED VIEW sro.%I AS SELECT sro.run(%L) AS r WITH NO DATA', 'mv_' || f, f);
    EXECUTE format('CREATE TABLE sro.%I (name text)', 'bait_' || f);
    EXECUTE format('INSERT INTO sro.%I VALUES (%L)', 'bait_' || f, f);
  END LOOP;
END $$;
SELECT throws_ok(format('REFRESH MATERIALIZED VIEW sro.%I', 'mv_' || name), '42501',
                 format('cannot call %s inside a security-restricted operation', name),
                 name || ': refused inside REFRESH MATERIALIZED VIEW (42501)')
  FROM sro.calls ORDER BY name;
SELECT is(sro.keys(), (SELECT keys FROM before), 'REFRESH MATERIALIZED VIEW: no key changed');

-- Inside an index expression, evaluated by CREATE INDEX for the row already in the table.
SELECT throws_ok(format('CREATE INDEX ON sro.%I (sro.run(name))', 'bait_' || name), '42501',
                 format('cannot call %s inside a security-restricted operation', name),
                 name || ': refused inside an index expression (42501)')
  FROM sro.calls ORDER BY name;
SELECT is(sro.keys(), (SELECT keys FROM before), 'index expression: no key changed');

-- The same calls outside a restricted operation do what they were refused: each one now
-- succeeds (in a transaction rolled back, so that the next one sees the same state).
CREATE FUNCTION sro.succeeds(name text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    PERFORM sro.run(name);
    RAISE EXCEPTION USING ERRCODE = 'P0004', MESSAGE = 'ran';  -- undo, keep the verdict
  EXCEPTION WHEN assert_failure THEN
    RETURN true;
  WHEN OTHERS THEN
    RETURN false;
  END;
END $$;
SELECT ok(sro.succeeds(name), name || ': the same call succeeds outside a restricted operation')
  FROM sro.calls ORDER BY name;
SELECT is(sro.keys(), (SELECT keys FROM before), 'and those calls were undone');

-- A SECURITY DEFINER function does not lift the restriction: the refusal is of the
-- restricted operation, whoever owns the code.
CREATE FUNCTION sro.run_definer(name text) RETURNS text LANGUAGE sql IMMUTABLE SECURITY DEFINER
  AS $$ SELECT sro.run(name) $$;
CREATE MATERIALIZED VIEW sro.mv_definer AS SELECT sro.run_definer('complete_key') AS r WITH NO DATA;
SELECT throws_ok('REFRESH MATERIALIZED VIEW sro.mv_definer', '42501', NULL,
                 'complete_key through a SECURITY DEFINER function in REFRESH MATERIALIZED VIEW: 42501');
SELECT is(sro.keys(), (SELECT keys FROM before), 'at the end no key changed');

SELECT * FROM finish();
