-- pgTAP: the claim protocol's state machine, fencing, security, fingerprints and settings.
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed.
-- On every path: test/run.sh runs this file as it is (claims written by the direct heap
-- path) and again with the table on the executor path (test/paths/executor.setup.sql), and
-- requires the same result lines.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(178);

-------------------------------------------------------------------------------
-- 1. A hostile search_path changes nothing (before any other call in this backend, so
--    that the statements are prepared under it).
-------------------------------------------------------------------------------
CREATE SCHEMA hostile;
CREATE FUNCTION hostile.text_eq(text, text) RETURNS boolean LANGUAGE plpgsql AS
  $$BEGIN RAISE EXCEPTION 'hostile operator called'; END$$;
CREATE OPERATOR hostile.= (LEFTARG = text, RIGHTARG = text, FUNCTION = hostile.text_eq);
CREATE FUNCTION hostile.now() RETURNS timestamptz LANGUAGE sql AS $$SELECT '2000-01-01'::timestamptz$$;
SET search_path = hostile, pg_catalog, public;
CREATE TEMP TABLE hostile_run AS
  SELECT 1 AS n, status FROM idempotency.claim_key('sp-1')
  UNION ALL SELECT 2, status FROM idempotency.claim_key('sp-1');
RESET search_path;
SELECT is((SELECT status FROM hostile_run WHERE n = 1), 'claimed', 'hostile search_path: claim works');
SELECT is((SELECT status FROM hostile_run WHERE n = 2), 'in_progress', 'hostile search_path: the duplicate is seen');
SELECT ok((SELECT created_at > '2020-01-01' FROM idempotency_keys WHERE key = 'sp-1'),
          'hostile search_path: times come from the server clock');
SELECT is((claim_key('sp-1')).status, 'in_progress', 'normal search_path afterwards');

-------------------------------------------------------------------------------
-- 2. Objects
-------------------------------------------------------------------------------
-- C++ edition only, from here (the portable edition's objects: portable_install.sql)
SELECT has_schema('idempotency', 'the extension has its own schema idempotency');
SELECT is((SELECT rolsuper FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner WHERE nspname = 'idempotency'),
          true, 'a superuser owns the schema');
SELECT is((SELECT nspname::text FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
            WHERE extname = 'idempotency'), 'idempotency', 'the extension is installed in it');
SELECT is((SELECT count(*)::int FROM pg_depend d JOIN pg_extension e ON d.refobjid = e.oid AND e.extname = 'idempotency'
            WHERE d.deptype = 'e' AND ((d.classid = 'pg_proc'::regclass
                                        AND (SELECT pronamespace FROM pg_proc WHERE oid = d.objid) NOT IN ('idempotency'::regnamespace, 'idempotency_monitor'::regnamespace))
                                    OR (d.classid = 'pg_class'::regclass
                                        AND (SELECT relnamespace FROM pg_class WHERE oid = d.objid) NOT IN ('idempotency'::regnamespace, 'idempotency_monitor'::regnamespace))
                                    OR (d.classid = 'pg_type'::regclass
                                        AND (SELECT typnamespace FROM pg_type WHERE oid = d.objid) NOT IN ('idempotency'::regnamespace, 'idempotency_monitor'::regnamespace)))),
          0, 'every function, table, view and type of the extension is in schema idempotency (the monitoring view in idempotency_monitor)');
SELECT ok(NOT has_schema_privilege('public', 'idempotency', 'USAGE'), 'PUBLIC has no USAGE on the schema');
SELECT ok(NOT has_schema_privilege('pg_monitor', 'idempotency', 'USAGE'), 'pg_monitor has no USAGE on the schema (1.2: it could claim keys)');
SELECT ok(has_schema_privilege('pg_monitor', 'idempotency_monitor', 'USAGE'), 'pg_monitor reads the statistics in idempotency_monitor');
SELECT has_table('idempotency', 'idempotency_keys', 'idempotency.idempotency_keys exists');
SELECT col_is_pk('idempotency', 'idempotency_keys', ARRAY['key', 'scope', 'owner'],
                 'the primary key is (key, scope, owner): the identity (owner, scope, key), the key compared first');
SELECT is((SELECT attname::text FROM pg_attribute WHERE attrelid = 'idempotency.idempotency_keys'::regclass AND attnum = 1),
          'owner', 'owner is the first column');
SELECT col_type_is('idempotency', 'idempotency_keys', 'owner', 'text', 'owner is a text: the role''s name');
SELECT is((SELECT collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
            WHERE attrelid = 'idempotency_keys'::regclass AND attname = 'owner'),
          'C', 'owner is compared in the C collation');
SELECT col_type_is('idempotency', 'idempotency_keys', 'lease', 'interval', 'lease is an interval');
SELECT col_not_null('idempotency', 'idempotency_keys', 'lease', 'lease is NOT NULL');
SELECT has_index('idempotency_keys', 'idempotency_keys_expires_at_idx', 'expires_at');
SELECT has_column('idempotency_keys', c) FROM unnest(ARRAY['fingerprint', 'status', 'response',
  'response_code', 'recovery_point', 'lease_token', 'locked_until', 'attempts', 'owner',
  'created_at', 'updated_at', 'expires_at', 'ttl', 'lease']) AS c;
SELECT col_type_is('idempotency_keys', 'status', 'key_status');
SELECT is((SELECT collname FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
            WHERE attrelid = 'idempotency_keys'::regclass AND attname = 'key'),
          'C', 'key is compared in the C collation');
SELECT enum_has_labels('claim_status', ARRAY['claimed', 'reclaimed', 'replay', 'mismatch', 'in_progress']);
SELECT enum_has_labels('key_status', ARRAY['processing', 'completed']);
SELECT isnt_definer('idempotency', f, format('%s is SECURITY INVOKER', f))
  FROM unnest(ARRAY['claim_key', 'complete_key', 'release_key', 'checkpoint_key']) AS f;
SELECT ok((SELECT extconfig @> ARRAY['idempotency_keys'::regclass::oid] FROM pg_extension
            WHERE extname = 'idempotency'), 'pg_dump keeps the rows (pg_extension_config_dump)');
SELECT ok(NOT has_table_privilege('public', 'idempotency_keys', 'SELECT,INSERT,UPDATE,DELETE'),
          'PUBLIC has no right on the table');
SELECT ok(NOT has_table_privilege('public', 'idempotency.key_lock_salt', 'SELECT,INSERT,UPDATE,DELETE'),
          'PUBLIC has no right on the key locks'' secret either');
SELECT is((SELECT count(*)::int FROM pg_depend d
             JOIN pg_extension e ON d.refobjid = e.oid AND e.extname = 'idempotency'
            WHERE d.deptype = 'e' AND d.classid IN ('pg_proc'::regclass, 'pg_class'::regclass, 'pg_type'::regclass)
              AND obj_description(d.objid, d.classid::regclass::text) IS NULL
              AND NOT (d.classid = 'pg_type'::regclass AND EXISTS (
                SELECT 1 FROM pg_type t WHERE t.oid = d.objid AND (t.typrelid <> 0 AND t.typtype = 'c' AND
                  EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = t.typrelid AND r.relkind <> 'c'))
                  OR (t.oid = d.objid AND t.typcategory = 'A')))),
          0, 'every function, table, view and type has a COMMENT');
-- C++ edition only, to here

-------------------------------------------------------------------------------
-- 3. The state machine
-------------------------------------------------------------------------------
CREATE TEMP TABLE t AS SELECT * FROM claim_key('sm-1', request_fingerprint('{"a": 1}'::jsonb), ttl => '2 hours', lease => '10 min');
SELECT is((SELECT status FROM t), 'claimed', 'new key: claimed');
SELECT is((SELECT attempts FROM t), 1, 'claimed: attempts 1');
SELECT ok((SELECT uuid_v7_time(token) IS NOT NULL FROM t), 'claimed: the token is a UUIDv7');
SELECT is((SELECT expires_at - created_at FROM t), '2 hours'::interval, 'claimed: expires after ttl');
SELECT is((SELECT fingerprint FROM t), request_fingerprint('{"a": 1}'::jsonb), 'claimed: the fingerprint is returned');
SELECT is((SELECT response FROM t), NULL, 'claimed: no response');
SELECT is((SELECT owner FROM idempotency_keys WHERE key = 'sm-1'), current_user::text,
          'the row belongs to the calling role');
-- Without ttl and lease, the defaults (24 hours, 5 minutes): the portable edition takes them
-- on its short path for the usual call, which must store what the settings' path stores.
CREATE TEMP TABLE t_defaults AS SELECT * FROM claim_key('sm-defaults');
SELECT is((SELECT format('%s %s %s %s', k.ttl, k.lease, k.expires_at - k.created_at, k.locked_until - k.created_at)
             FROM idempotency_keys k, t_defaults d WHERE k.key = 'sm-defaults' AND d.status = 'claimed'),
          '24:00:00 00:05:00 1 day 00:05:00', 'claimed without ttl and lease: 24 hours and 5 minutes, stored as spans');
SELECT is((SELECT locked_until - created_at FROM idempotency_keys WHERE key = 'sm-1'), '10 min'::interval, 'the lease is as asked');

CREATE TEMP TABLE d AS SELECT * FROM claim_key('sm-1', request_fingerprint('{"a": 1}'::jsonb));
SELECT is((SELECT status FROM d), 'in_progress', 'held key: in_progress');
SELECT ok((SELECT retry_after > '9 min' AND retry_after <= '10 min' FROM d), 'in_progress: retry_after is the rest of the lease');
SELECT is((SELECT token FROM d), NULL, 'in_progress: no token revealed');

SELECT is((SELECT status FROM claim_key('sm-1', request_fingerprint('{"a": 2}'::jsonb))), 'mismatch',
          'held key, other payload: mismatch');

SELECT is((SELECT status FROM complete_key('sm-1', (SELECT token FROM t), '{"id": "ch_1"}', 201)), 'replay',
          'complete_key answers replay');
SELECT is((SELECT expires_at - updated_at FROM idempotency_keys WHERE key = 'sm-1'), '2 hours'::interval,
          'completion moves expires_at to completion + ttl');
CREATE TEMP TABLE before_replay AS SELECT xmin::text AS x, ctid::text AS c, updated_at FROM idempotency_keys WHERE key = 'sm-1';
CREATE TEMP TABLE r AS SELECT * FROM claim_key('sm-1', request_fingerprint('{ "a":1 }'::jsonb));
SELECT is((SELECT status FROM r), 'replay', 'completed key, same payload: replay');
SELECT is((SELECT response FROM r), '{"id": "ch_1"}'::jsonb, 'replay: the stored response');
SELECT is((SELECT response_code FROM r), 201, 'replay: the stored response code');
SELECT is((SELECT token FROM r), NULL, 'replay: no token');
SELECT ok((SELECT x = k.xmin::text AND c = k.ctid::text AND b.updated_at = k.updated_at
             FROM before_replay b, idempotency_keys k WHERE k.key = 'sm-1'), 'a replay writes nothing');
SELECT is((SELECT status FROM claim_key('sm-1')), 'replay', 'NULL fingerprint: not checked, replay');
CREATE TEMP TABLE m AS SELECT * FROM claim_key('sm-1', request_fingerprint('{"a": 3}'::jsonb));
SELECT is((SELECT status FROM m), 'mismatch', 'completed key, other payload: mismatch');
SELECT is((SELECT response FROM m), NULL, 'mismatch: no response');
SELECT is((SELECT response_code FROM m), NULL, 'mismatch: no response code');
SELECT is((SELECT fingerprint FROM m), request_fingerprint('{"a": 1}'::jsonb), 'mismatch: the stored fingerprint');

-- release -> reclaimed; checkpoint keeps the recovery point
CREATE TEMP TABLE c1 AS SELECT * FROM claim_key('sm-2', request_fingerprint('job'::text));
SELECT ok(checkpoint_key('sm-2', (SELECT token FROM c1), 'charged', lease => '20 min')
            BETWEEN clock_timestamp() + '19 min' AND clock_timestamp() + '20 min', 'checkpoint_key returns the new lease end');
SELECT is((SELECT recovery_point FROM idempotency_keys WHERE key = 'sm-2'), 'charged', 'checkpoint stores the recovery point');
SELECT lives_ok(format('SELECT release_key(%L, %L)', 'sm-2', (SELECT token FROM c1)), 'release_key with the token');
SELECT is((SELECT lease_token FROM idempotency_keys WHERE key = 'sm-2'), NULL, 'a released key has no holder');
SELECT is((SELECT locked_until FROM idempotency_keys WHERE key = 'sm-2'), NULL, 'and no lease: locked_until is cleared');
CREATE TEMP TABLE c2 AS SELECT * FROM claim_key('sm-2', request_fingerprint('job'::text));
SELECT is((SELECT status FROM c2), 'reclaimed', 'released key: reclaimed at once');
SELECT is((SELECT attempts FROM c2), 2, 'reclaimed: attempts 2');
SELECT is((SELECT recovery_point FROM c2), 'charged', 'reclaimed: the recovery point is kept');
SELECT isnt((SELECT token FROM c2), (SELECT token FROM c1), 'reclaimed: a new token');
SELECT ok((SELECT c2.token > c1.token FROM c1, c2), 'tokens increase (UUIDv7)');

-- lease expiry -> reclaimed; expiry -> claimed afresh
CREATE TEMP TABLE l1 AS SELECT * FROM claim_key('sm-3', lease => '1 microsecond');
SELECT is((SELECT status FROM claim_key('sm-3')), 'reclaimed', 'lease ended: reclaimed');
CREATE TEMP TABLE e1 AS SELECT * FROM claim_key('sm-4', ttl => '50 milliseconds', lease => '1 hour');
SELECT lives_ok(format('SELECT complete_key(%L, %L, %L)', 'sm-4', (SELECT token FROM e1), '{"old": true}'),
                'complete a short-lived key');
DO $$BEGIN PERFORM pg_sleep(0.1); END$$;  -- past its expiry: a fixed deadline, not a race
CREATE TEMP TABLE e2 AS SELECT * FROM claim_key('sm-4');
SELECT is((SELECT status FROM e2), 'claimed', 'expired key: claimed afresh without any cleanup');
SELECT is((SELECT attempts FROM e2), 1, 'expired key: attempts start again');
SELECT is((SELECT response FROM idempotency_keys WHERE key = 'sm-4'), NULL, 'expired key: the old response is gone');
SELECT is((SELECT status::text FROM idempotency_keys WHERE key = 'sm-4'), 'processing', 'expired key: processing again');

-- a processing key never expires while its lease runs
CREATE TEMP TABLE p1 AS SELECT * FROM claim_key('sm-5', ttl => '1 second', lease => '1 hour');
SELECT ok((SELECT expires_at >= created_at + '1 hour' FROM p1), 'a lease longer than the ttl extends the expiry');

-------------------------------------------------------------------------------
-- 4. Fencing
-------------------------------------------------------------------------------
CREATE TEMP TABLE f1 AS SELECT * FROM claim_key('fx', lease => '1 microsecond');
CREATE TEMP TABLE f2 AS SELECT * FROM claim_key('fx');
SELECT is((SELECT status FROM f2), 'reclaimed', 'fencing: reclaimed after the lease');
CREATE TEMP TABLE fx_before AS SELECT k::text AS row_text FROM idempotency_keys k WHERE key = 'fx';
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'fx', (SELECT token FROM f1), '{}'), '55000', NULL,
                 'stale token: complete_key fails');
SELECT throws_ok(format('SELECT checkpoint_key(%L, %L, %L)', 'fx', (SELECT token FROM f1), 'x'), '55000', NULL,
                 'stale token: checkpoint_key fails');
SELECT throws_ok(format('SELECT release_key(%L, %L)', 'fx', (SELECT token FROM f1)), '55000', NULL,
                 'stale token: release_key fails');
SELECT is((SELECT k::text FROM idempotency_keys k WHERE key = 'fx'), (SELECT row_text FROM fx_before),
          'stale calls changed nothing');
SELECT is((SELECT status FROM complete_key('fx', (SELECT token FROM f2), '{"n": 1}')), 'replay', 'the current holder completes');
CREATE TEMP TABLE fx_done AS SELECT xmin::text AS x FROM idempotency_keys WHERE key = 'fx';
SELECT is((SELECT response FROM complete_key('fx', (SELECT token FROM f2), '{"n": 1}')), '{"n": 1}'::jsonb,
          'the same completion again is a no-op success');
SELECT is((SELECT xmin::text FROM idempotency_keys WHERE key = 'fx'), (SELECT x FROM fx_done), 'the no-op wrote nothing');
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'fx', (SELECT token FROM f2), '{"n": 2}'), '55000', NULL,
                 'another response for a completed key is refused');
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'nope', gen_uuid_v7(), '{}'), 'P0002', NULL,
                 'unknown key: P0002');

-------------------------------------------------------------------------------
-- 5. Inbox pattern inside savepoints: a rolled-back claim is gone
-------------------------------------------------------------------------------
BEGIN;
SAVEPOINT a;
SELECT is((SELECT status FROM claim_key('ib-1')), 'claimed', 'claim inside a savepoint');
ROLLBACK TO SAVEPOINT a;
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key = 'ib-1'), 0, 'rolled back: no row');
SELECT is((SELECT status FROM claim_key('ib-1')), 'claimed', 'a retry claims afresh');
COMMIT;

-------------------------------------------------------------------------------
-- 6. Fingerprints
-------------------------------------------------------------------------------
SELECT is(length(request_fingerprint('{}'::jsonb)), 32, 'SHA-256: 32 bytes');
SELECT is(request_fingerprint('abc'::text), sha256('abc'::bytea), 'text: SHA-256 of its bytes');
SELECT is(request_fingerprint('\x0001ff'::bytea), sha256('\x0001ff'::bytea), 'bytea: SHA-256 of the bytes');
SELECT is(request_fingerprint('{"b": 2, "a": [1, {"y": true, "x": null}]}'::jsonb),
          request_fingerprint('{"a":[1,{"x":null,"y":true}],"b":2}'::jsonb), 'jsonb: key order and spacing do not matter');
SELECT is(request_fingerprint('{"amount": 1.0}'::jsonb), request_fingerprint('{"amount": 1.00}'::jsonb),
          'jsonb: equal numbers give equal fingerprints');
SELECT is(request_fingerprint('{"a": 1, "a": 2}'::jsonb), request_fingerprint('{"a": 2}'::jsonb),
          'jsonb: duplicate keys as jsonb keeps them');
SELECT isnt(request_fingerprint('[1, 2]'::jsonb), request_fingerprint('[2, 1]'::jsonb), 'jsonb: array order matters');
SELECT isnt(request_fingerprint('"a"'::jsonb), request_fingerprint('["a"]'::jsonb), 'jsonb: a scalar is not a one-element array');
SELECT isnt(request_fingerprint('{"a": "1"}'::jsonb), request_fingerprint('{"a": 1}'::jsonb), 'jsonb: a string is not a number');
SELECT isnt(request_fingerprint('{"ab": "c"}'::jsonb), request_fingerprint('{"a": "bc"}'::jsonb), 'jsonb: token boundaries count');
SELECT is(request_fingerprint(NULL::jsonb), NULL, 'NULL payload: NULL fingerprint');

-------------------------------------------------------------------------------
-- 7. Security: an application role without any right on the table
-------------------------------------------------------------------------------
DROP ROLE IF EXISTS tap_app_a;
DROP ROLE IF EXISTS tap_app_b;
CREATE ROLE tap_app_a;
CREATE ROLE tap_app_b;
SET ROLE tap_app_a;
SELECT throws_ok($$SELECT idempotency.claim_key('sec-0')$$, '42501', 'permission denied for schema idempotency',
                 'without USAGE on the schema an application role reaches nothing');
RESET ROLE;
GRANT USAGE ON SCHEMA idempotency TO tap_app_a, tap_app_b;
SET ROLE tap_app_a;
CREATE TEMP TABLE a1 AS SELECT * FROM claim_key('sec-1', request_fingerprint('p'::text));
GRANT SELECT ON a1 TO PUBLIC;
SELECT is((SELECT status FROM a1), 'claimed', 'an application role can claim');
SELECT is((SELECT status FROM complete_key('sec-1', (SELECT token FROM a1), '{"ok": 1}')), 'replay', 'and complete');
SELECT is((SELECT status FROM claim_key('sec-1', request_fingerprint('p'::text))), 'replay', 'and replay');
-- C++ edition only, from here (the portable edition: a role reads and writes its own rows, portable_security.sql)
SELECT throws_ok('SELECT * FROM idempotency_keys', '42501', NULL, 'but cannot read the table');
SELECT throws_ok($$UPDATE idempotency_keys SET response = '{}'$$, '42501', NULL, 'nor update it');
SELECT throws_ok('DELETE FROM idempotency_keys', '42501', NULL, 'nor delete from it');
-- C++ edition only, to here
SELECT throws_ok($$INSERT INTO idempotency_keys (key, owner, ttl, created_at, expires_at, updated_at)
                   VALUES ('x', 1, '1h', now(), now(), now())$$, '42501', NULL, 'nor insert into it');
SELECT throws_ok('SELECT idempotency_cleanup()', '42501', NULL, 'nor run the cleanup');
-- A SECURITY DEFINER function of tap_app_a claims for its owner, whoever calls it.
CREATE FUNCTION pg_temp.claim_as_a(k text) RETURNS idempotency.claim_result LANGUAGE sql SECURITY DEFINER
  AS $$SELECT * FROM idempotency.claim_key(k)$$;
RESET ROLE;
SELECT is((SELECT owner FROM idempotency_keys WHERE key = 'sec-1'), 'tap_app_a',
          'owner is the caller (current_user)');
CREATE TEMP TABLE sec_1_before AS SELECT k::text AS row_text FROM idempotency_keys k WHERE key = 'sec-1';
SET ROLE tap_app_b;
-- tap_app_a's key does not exist for tap_app_b, even with its token (P0002, as for an absent key)
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'sec-1', (SELECT token FROM a1), '{}'), 'P0002', NULL,
                 'another role cannot complete with a stolen token: no such key (P0002)');
SELECT throws_ok(format('SELECT checkpoint_key(%L, %L, %L)', 'sec-1', (SELECT token FROM a1), 'x'), 'P0002', NULL,
                 'nor checkpoint it');
SELECT throws_ok(format('SELECT release_key(%L, %L)', 'sec-1', (SELECT token FROM a1)), 'P0002', NULL,
                 'nor release it');
-- the same scope and key is tap_app_b's own key: claimed afresh, nothing of tap_app_a's revealed
CREATE TEMP TABLE b1 AS SELECT * FROM claim_key('sec-1', request_fingerprint('p'::text));
SELECT is((SELECT status FROM b1), 'claimed', 'another role: the same key is its own, claimed afresh');
SELECT is((SELECT attempts || ' ' || coalesce(response::text, 'no response') FROM b1), '1 no response',
          'another role: attempts 1, no response of the first role''s key');
CREATE TEMP TABLE b2 AS SELECT * FROM claim_key('sec-1', request_fingerprint('q'::text));
SELECT is((SELECT status FROM b2), 'mismatch', 'its own key holds its own fingerprint');
SELECT is((SELECT status FROM claim_key('sec-1', scope => 'tenant-b')), 'claimed', 'another scope is another key');
SELECT is((SELECT status FROM pg_temp.claim_as_a('sec-2')), 'claimed',
          'tap_app_b claims through tap_app_a''s SECURITY DEFINER function');
RESET ROLE;
SELECT is((SELECT k::text FROM idempotency_keys k WHERE key = 'sec-1' AND owner = 'tap_app_a'),
          (SELECT row_text FROM sec_1_before), 'the first role''s key is unchanged');
SELECT is((SELECT string_agg(owner::text, ',' ORDER BY owner::text) FROM idempotency_keys WHERE key = 'sec-1' AND scope = ''),
          'tap_app_a,tap_app_b', 'two keys sec-1 in scope '''', one per role');
SELECT is((SELECT owner::text FROM idempotency_keys WHERE key = 'sec-2'), 'tap_app_a',
          'a key claimed inside a SECURITY DEFINER function belongs to the function''s owner');
SET ROLE tap_app_a;
SELECT is((SELECT status || ' ' || response::text FROM claim_key('sec-1', request_fingerprint('p'::text))), 'replay {"ok": 1}',
          'the first role still replays its own response');
RESET ROLE;
DROP TABLE a1;
DROP TABLE b1;
DROP TABLE b2;
SELECT lives_ok('DROP OWNED BY tap_app_a, tap_app_b; DROP ROLE tap_app_a; DROP ROLE tap_app_b', 'roles dropped');

-------------------------------------------------------------------------------
-- 8. Settings
-------------------------------------------------------------------------------
SET idempotency.default_ttl = '3h';
SET idempotency.default_lease = '90s';
CREATE TEMP TABLE g1 AS SELECT * FROM claim_key('guc-1');
SELECT is((SELECT expires_at - created_at FROM g1), '3 hours'::interval, 'idempotency.default_ttl applies');
SELECT is((SELECT locked_until - created_at FROM idempotency_keys WHERE key = 'guc-1'), '90 seconds'::interval,
          'idempotency.default_lease applies');
-- checkpoint_key without a lease renews by the lease the claim was made with, not by
-- idempotency.default_lease
CREATE TEMP TABLE g2 AS SELECT * FROM claim_key('guc-2', lease => '20 min');
SELECT ok(checkpoint_key('guc-2', (SELECT token FROM g2), 'step-1')
            BETWEEN clock_timestamp() + '19 min' AND clock_timestamp() + '20 min',
          'checkpoint_key with a NULL lease renews by the claim''s lease (20 min, not 90 s)');
SELECT is((SELECT lease FROM idempotency_keys WHERE key = 'guc-2'), '20 min'::interval, 'the claim''s lease is stored');
RESET idempotency.default_ttl;
RESET idempotency.default_lease;
-- C++ edition only, from here (the portable edition refuses a bad setting at the call: portable_security.sql)
SELECT throws_ok($$SET idempotency.default_ttl = '-5'$$, '22023', NULL, 'a bad setting is refused');
-- C++ edition only, to here
SET idempotency.max_key_length = 4;
SELECT throws_ok($$SELECT claim_key('12345')$$, '22001', NULL, 'idempotency.max_key_length applies');
RESET idempotency.max_key_length;
SELECT is((SELECT status FROM claim_key(repeat('k', 255))), 'claimed', 'a key of exactly 255 bytes is accepted');
SELECT throws_ok($$SELECT claim_key(repeat('k', 256))$$, '22001', NULL, 'a key of 256 bytes is refused');

-------------------------------------------------------------------------------
-- 9. Exact boundaries (issue #16: each block kills a mutant that survived an earlier run)
-------------------------------------------------------------------------------
-- The response limit, at the limit and one byte over. complete_key measures the jsonb
-- datum it is given with toast_raw_datum_size: the uncompressed size, 4-byte header
-- included, which pg_column_size shows for a value that was never stored. A jsonb string
-- of n characters is 12 + n bytes (header, container header, one entry, the characters).
SELECT is(pg_column_size(to_jsonb(repeat('x', 1000))), 1012, 'a jsonb string of 1000 characters is a datum of 1012 bytes');
SET idempotency.max_response_size = 1012;
CREATE TEMP TABLE lim AS SELECT 'at' AS k, token FROM claim_key('size-at-limit')
  UNION ALL SELECT 'over', token FROM claim_key('size-over-limit');
SELECT is((complete_key('size-at-limit', (SELECT token FROM lim WHERE k = 'at'), to_jsonb(repeat('x', 1000)))).status,
          'replay', 'a response of exactly idempotency.max_response_size bytes is stored');
SELECT is((SELECT pg_column_size(response) FROM claim_key('size-at-limit')), 1012, 'and replayed whole');
SELECT throws_ok(format('SELECT complete_key(%L, %L, to_jsonb(repeat(%L, 1001)))', 'size-over-limit',
                        (SELECT token FROM lim WHERE k = 'over'), 'x'),
                 '54000', 'response is too large', 'a response one byte over idempotency.max_response_size is refused');
SELECT is((SELECT status::text || coalesce(response::text, ' without a response') FROM idempotency_keys WHERE key = 'size-over-limit'),
          'processing without a response', 'the refused response changed nothing');
RESET idempotency.max_response_size;

-- Fingerprints that differ in one byte only: the only byte of a 1-byte fingerprint, the
-- first and the last of a 32-byte one; and one that is a prefix of the other. Each pair:
-- a completed key answers mismatch (no response), a held key answers mismatch too, and the
-- stored fingerprint itself replays.
CREATE TEMP TABLE fp (name text, stored bytea, other bytea);
INSERT INTO fp VALUES
  ('1 byte', '\x01', '\x00'),
  ('32 bytes, first byte', sha256('fp'), set_byte(sha256('fp'), 0, get_byte(sha256('fp'), 0) # 1)),
  ('32 bytes, last byte', sha256('fp'), set_byte(sha256('fp'), 31, get_byte(sha256('fp'), 31) # 128)),
  ('a prefix', '\x0102', '\x01');
SELECT is((SELECT count(*)::int FROM fp WHERE length(stored) = length(other) AND
            (SELECT count(*) FROM generate_series(0, length(stored) - 1) i WHERE get_byte(stored, i) <> get_byte(other, i)) = 1),
          3, 'three pairs differ in exactly one byte (and one is a prefix)');
CREATE TEMP TABLE fp_done AS
  SELECT name, (complete_key('fp-done ' || name, (claim_key('fp-done ' || name, stored)).token, '{"paid": 1}')).status FROM fp;
SELECT is(status, 'replay', 'fingerprint, ' || name || ': completed') FROM fp_done ORDER BY name;
SELECT is((SELECT status::text || coalesce(' ' || response::text, '') FROM claim_key('fp-done ' || name, other)),
          'mismatch', 'fingerprint, ' || name || ': a completed key answers mismatch, without the response')
  FROM fp ORDER BY name;
SELECT is((SELECT status::text || ' ' || response::text FROM claim_key('fp-done ' || name, stored)),
          'replay {"paid": 1}', 'fingerprint, ' || name || ': the same fingerprint replays')
  FROM fp ORDER BY name;
CREATE TEMP TABLE fp_held AS SELECT name, (claim_key('fp-held ' || name, stored)).status FROM fp;
SELECT is(status, 'claimed', 'fingerprint, ' || name || ': claimed') FROM fp_held ORDER BY name;
SELECT is((claim_key('fp-held ' || name, other)).status, 'mismatch',
          'fingerprint, ' || name || ': a held key answers mismatch')
  FROM fp ORDER BY name;
SELECT is((claim_key('fp-held ' || name, stored)).status, 'in_progress',
          'fingerprint, ' || name || ': the same fingerprint is in progress')
  FROM fp ORDER BY name;

-- checkpoint_key renews the lease in the stored row and moves expires_at out with it, so
-- that the lease never outlives the key; a shorter renewal never pulls expires_at in.
CREATE TEMP TABLE ck AS SELECT * FROM claim_key('ck-out', ttl => '1 min', lease => '1 min');
CREATE TEMP TABLE ck_until AS SELECT checkpoint_key('ck-out', (SELECT token FROM ck), 'step-1', lease => '1 hour') AS until;
SELECT ok((SELECT until > (SELECT expires_at FROM ck) + '58 min' FROM ck_until), 'checkpoint_key: the lease is renewed by an hour');
SELECT is((SELECT locked_until FROM idempotency_keys WHERE key = 'ck-out'), (SELECT until FROM ck_until),
          'checkpoint_key: the stored lease ends when checkpoint_key says');
SELECT is((SELECT expires_at FROM idempotency_keys WHERE key = 'ck-out'), (SELECT until FROM ck_until),
          'checkpoint_key: a lease renewed past the expiry moves expires_at to its end');
SELECT is((SELECT recovery_point FROM idempotency_keys WHERE key = 'ck-out'), 'step-1', 'checkpoint_key: the recovery point is stored');
CREATE TEMP TABLE ck2 AS SELECT * FROM claim_key('ck-in', ttl => '2 hours', lease => '10 min');
CREATE TEMP TABLE ck2_until AS SELECT checkpoint_key('ck-in', (SELECT token FROM ck2), 'step-1', lease => '1 min') AS until;
SELECT is((SELECT locked_until FROM idempotency_keys WHERE key = 'ck-in'), (SELECT until FROM ck2_until),
          'checkpoint_key: a shorter lease is stored as asked');
SELECT is((SELECT expires_at FROM idempotency_keys WHERE key = 'ck-in'), (SELECT expires_at FROM ck2),
          'checkpoint_key: a lease that ends before the expiry leaves expires_at alone');

SELECT * FROM finish();
