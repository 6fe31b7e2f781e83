-- pgTAP: branches of the claim protocol that no other test pinned (issue #22): a claim
-- completed after its own ttl and lease ran out in the claiming transaction, a completion
-- repeated with another response code, the structure of a fingerprint, the order of the
-- expiry and fingerprint checks, what a mismatch answers, and a remembered row read after
-- the table's file changed in the claiming transaction.
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed.
-- On every path: run as it is and with the table on the executor path
-- (test/paths/executor.setup.sql); the result lines must be the same.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;
CREATE EXTENSION amcheck;

SELECT plan(76);

-- A key's row in one comparable string (status, attempts, code, response, recovery point).
CREATE FUNCTION row_of(k text) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce((SELECT format('%s attempts=%s code=%s response=%s rp=%s', status, attempts,
                                 coalesce(response_code::text, '-'), coalesce(response::text, '-'),
                                 coalesce(recovery_point, '-'))
                     FROM idempotency.idempotency_keys WHERE key = k), 'absent') $$;
-- Heap and every index of idempotency_keys consistent (amcheck): the heap has no corrupt
-- tuple, and each B-Tree holds exactly the heap's live tuples (the expiry index is a BRIN on
-- 16+, which amcheck does not check before 18: include/indexes_whole.sql checks it elsewhere).
CREATE FUNCTION table_whole() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE i regclass;
BEGIN
  IF EXISTS (SELECT FROM verify_heapam('idempotency.idempotency_keys')) THEN RETURN false; END IF;
  FOR i IN SELECT x.indexrelid::regclass FROM pg_index x
             JOIN pg_class c ON c.oid = x.indexrelid JOIN pg_am a ON a.oid = c.relam
            WHERE x.indrelid = 'idempotency.idempotency_keys'::regclass AND a.amname = 'btree' LOOP
    PERFORM bt_index_check(i, true);
  END LOOP;
  RETURN true;
END $$;

-------------------------------------------------------------------------------
-- 1. A claim whose own ttl and lease ran out in the claiming transaction is gone for every
--    fenced call of that transaction (P0002), on the direct completion as on the executor's.
--    Everything happens inside one open transaction: no cleanup can touch the row.
-------------------------------------------------------------------------------
BEGIN;
SELECT token AS exp_token FROM claim_key('exp-own', ttl => '10 ms', lease => '10 ms') \gset
DO $$BEGIN PERFORM pg_sleep(0.05); END$$;  -- past both ends: a fixed deadline, not a race
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'exp-own', :'exp_token', '{"late": true}'),
                 'P0002', 'idempotency key "exp-own" does not exist or has expired',
                 'expired own claim: complete_key fails with P0002');
SELECT throws_ok(format('SELECT * FROM complete_keys(ARRAY[%L], ARRAY[%L]::uuid[], ARRAY[%L]::jsonb[])', 'exp-own',
                        :'exp_token', '{"late": true}'),
                 'P0002', NULL, 'expired own claim: complete_keys fails with P0002');
SELECT throws_ok(format('SELECT release_key(%L, %L)', 'exp-own', :'exp_token'), 'P0002', NULL,
                 'expired own claim: release_key fails with P0002');
SELECT throws_ok(format('SELECT checkpoint_key(%L, %L, %L, lease => %L)', 'exp-own', :'exp_token', 'step', '1 hour'),
                 'P0002', NULL, 'expired own claim: checkpoint_key with a lease fails with P0002');
SELECT throws_ok(format('SELECT checkpoint_key(%L, %L, %L)', 'exp-own', :'exp_token', 'step'), 'P0002', NULL,
                 'expired own claim: checkpoint_key without a lease fails with P0002');
SELECT is(row_of('exp-own'), 'processing attempts=1 code=- response=- rp=-', 'expired own claim: nothing changed');
-- Only the ttl ran out: the lease still runs, so the key is live and completes.
SELECT token AS live_token FROM claim_key('ttl-out-lease-on', ttl => '10 ms', lease => '1 hour') \gset
DO $$BEGIN PERFORM pg_sleep(0.05); END$$;
SELECT is((complete_key('ttl-out-lease-on', :'live_token', '{"ok": true}')).status, 'replay',
          'own claim past its ttl but within its lease: complete_key succeeds');
COMMIT;

-------------------------------------------------------------------------------
-- 2. A completion repeated with the same response but another response code, or none, is
--    refused (55000) and changes nothing; with the same response and code it is a no-op.
-------------------------------------------------------------------------------
BEGIN;
SELECT token AS rc_token FROM claim_key('rc-own') \gset
SELECT is((complete_key('rc-own', :'rc_token', '{"paid": 1}', 200)).status, 'replay', 'in the claim''s transaction: completed with 200');
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L, 201)', 'rc-own', :'rc_token', '{"paid": 1}'), '55000',
                 'idempotency key "rc-own" was already completed with another response',
                 'in the claim''s transaction: the same response with code 201 is refused (55000)');
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'rc-own', :'rc_token', '{"paid": 1}'), '55000', NULL,
                 'in the claim''s transaction: the same response without a code is refused');
SELECT is((complete_key('rc-own', :'rc_token', '{"paid": 1}', 200)).response_code, 200,
          'in the claim''s transaction: the same response and code is a no-op success');
COMMIT;
SELECT is(row_of('rc-own'), 'completed attempts=1 code=200 response={"paid": 1} rp=-', 'the refused repeats changed nothing');

SELECT token AS rc2_token FROM claim_key('rc-two-phase') \gset
SELECT is((complete_key('rc-two-phase', :'rc2_token', '{"paid": 2}')).status, 'replay', 'two-phase: completed without a code');
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L, 200)', 'rc-two-phase', :'rc2_token', '{"paid": 2}'), '55000', NULL,
                 'two-phase: the same response with a code is refused');
SELECT throws_ok(format('SELECT complete_key(%L, %L, NULL)', 'rc-two-phase', :'rc2_token'), '55000', NULL,
                 'two-phase: no response and no code is refused');
SELECT is((complete_key('rc-two-phase', :'rc2_token', '{"paid": 2}')).status, 'replay',
          'two-phase: the same response without a code is a no-op success');
SELECT is(row_of('rc-two-phase'), 'completed attempts=1 code=- response={"paid": 2} rp=-', 'two-phase: nothing changed');

SELECT token AS rc3_token FROM claim_key('rc-batch') \gset
SELECT is((SELECT status FROM complete_keys(ARRAY['rc-batch'], ARRAY[:'rc3_token']::uuid[], ARRAY['{"paid": 3}']::jsonb[], ARRAY[409])),
          'replay', 'batch: completed with 409');
SELECT throws_ok(format('SELECT * FROM complete_keys(ARRAY[%L], ARRAY[%L]::uuid[], ARRAY[%L]::jsonb[], ARRAY[200])',
                        'rc-batch', :'rc3_token', '{"paid": 3}'), '55000', NULL,
                 'batch: the same response with another code is refused');
SELECT throws_ok(format('SELECT * FROM complete_keys(ARRAY[%L], ARRAY[%L]::uuid[], ARRAY[%L]::jsonb[])',
                        'rc-batch', :'rc3_token', '{"paid": 3}'), '55000', NULL,
                 'batch: the same response without codes is refused');
SELECT is(row_of('rc-batch'), 'completed attempts=1 code=409 response={"paid": 3} rp=-', 'batch: nothing changed');

-------------------------------------------------------------------------------
-- 3. The structure of a fingerprint: different nestings of the same scalars differ; equal
--    jsonb values (key order, spacing, number spelling, escapes) are equal.
-------------------------------------------------------------------------------
SELECT isnt(request_fingerprint(a::jsonb), request_fingerprint(b::jsonb), 'fingerprint: ' || a || ' is not ' || b)
  FROM (VALUES ('[[1],2]', '[[1,2]]'),
               ('[1,[2]]', '[[1,2]]'),
               ('[[1],2]', '[1,[2]]'),
               ('[[1,2]]', '[1,2]'),
               ('[[]]', '[]'),
               ('[[],[]]', '[[[]]]'),
               ('{"a":{"b":1},"c":2}', '{"a":{"b":1,"c":2}}'),
               ('{"a":{"b":{"c":1}},"d":2}', '{"a":{"b":{"c":1},"d":2}}'),
               ('{"a":{}}', '{"a":[]}'),
               ('{"a":[1]}', '{"a":1}'),
               ('[{"a":1}]', '{"a":1}'),
               ('[{"a":1},{"b":2}]', '[{"a":1,"b":2}]'),
               ('[]', '{}'),
               ('[{}]', '[[]]'),
               ('1', '[1]'),
               ('null', '[null]'),
               ('[null]', '[]'),
               ('{"a":null}', '{}'),
               ('true', '"true"'),
               ('"1"', '1')) AS pairs(a, b);
SELECT is(request_fingerprint(a::jsonb), request_fingerprint(b::jsonb), 'fingerprint: ' || a || ' equals ' || b)
  FROM (VALUES ('{"b":{"y":[1,{"q":1,"p":2}],"x":2},"a":1}', E'{ "a": 1,\n  "b": {"x": 2, "y": [1, {"p": 2, "q": 1}]} }'),
               ('[1.0, {"n": 1.50}]', '[1, {"n": 1.5}]'),
               ('{"n": 1e2}', '{"n": 100}'),
               ('{"s": "\u00e9"}', '{"s": "é"}'),
               ('{"a": {"b": 1, "b": 2}}', '{"a": {"b": 2}}')) AS pairs(a, b);

-------------------------------------------------------------------------------
-- 4. Expiry is decided before the fingerprint: an expired row with another fingerprint is
--    a new key (claimed), not a mismatch. In one open transaction, out of the cleanup's reach.
-------------------------------------------------------------------------------
BEGIN;
SELECT complete_key('xf-done', (claim_key('xf-done', '\x01', ttl => '10 ms', lease => '10 ms')).token, '{"old": 1}', 200);
SELECT claim_key('xf-held', '\x01', ttl => '10 ms', lease => '10 ms');
SELECT claim_key('xf-batch', '\x01', ttl => '10 ms', lease => '10 ms');
SELECT claim_key('xf-live', '\x01', ttl => '1 hour', lease => '1 hour');
DO $$BEGIN PERFORM pg_sleep(0.05); END$$;
CREATE TEMP TABLE xf AS SELECT * FROM claim_key('xf-done', '\x02');
SELECT is((SELECT status FROM xf), 'claimed', 'expired completed key, another fingerprint: claimed, not mismatch');
SELECT is((SELECT row(attempts, response, response_code, fingerprint)::text FROM xf), '(1,,,"\\x02")',
          'claimed afresh: attempts 1, nothing of the old outcome, the new fingerprint');
SELECT is(row_of('xf-done'), 'processing attempts=1 code=- response=- rp=-', 'the old outcome is gone from the row');
SELECT is((SELECT fingerprint FROM idempotency_keys WHERE key = 'xf-done'), '\x02'::bytea, 'the new fingerprint is stored');
SELECT is((claim_key('xf-held', '\x02')).status, 'claimed', 'expired processing key, another fingerprint: claimed');
SELECT is((SELECT status FROM claim_keys(ARRAY['xf-batch'], ARRAY['\x02'::bytea])), 'claimed',
          'claim_keys: expired key, another fingerprint: claimed');
SELECT is((claim_key('xf-live', '\x02')).status, 'mismatch', 'a live key with another fingerprint: mismatch');
COMMIT;

-------------------------------------------------------------------------------
-- 5. A mismatch answers the stored fingerprint and nothing of the outcome: no response, no
--    response_code, no recovery_point, no token. recovery_point comes with replay and
--    reclaimed only.
-------------------------------------------------------------------------------
CREATE TEMP TABLE mm AS SELECT * FROM claim_key('mm-key', '\x01', lease => '1 hour');
SELECT ok(checkpoint_key('mm-key', (SELECT token FROM mm), 'charged') IS NOT NULL, 'a held key with a recovery point');
CREATE TEMP TABLE mm_held AS SELECT * FROM claim_key('mm-key', '\x02');
SELECT is((SELECT status FROM mm_held), 'mismatch', 'held key, another fingerprint: mismatch');
SELECT is((SELECT row(fingerprint, response, response_code, recovery_point, token, retry_after)::text FROM mm_held),
          '("\\x01",,,,,)', 'held key: mismatch carries the stored fingerprint only (no response, code, recovery point, token)');
SELECT is((complete_key('mm-key', (SELECT token FROM mm), '{"charged": 42}', 201)).recovery_point, 'charged',
          'completed: the completion answers with the recovery point');
CREATE TEMP TABLE mm_done AS SELECT * FROM claim_key('mm-key', '\x02');
SELECT is((SELECT status FROM mm_done), 'mismatch', 'completed key, another fingerprint: mismatch');
SELECT is((SELECT row(fingerprint, response, response_code, recovery_point, token, retry_after)::text FROM mm_done),
          '("\\x01",,,,,)', 'completed key: mismatch carries the stored fingerprint only');
SELECT is((SELECT row(attempts, created_at = (SELECT created_at FROM mm), expires_at IS NOT NULL)::text FROM mm_done), '(1,t,t)',
          'and the key''s attempts and times');
SELECT is((SELECT row(fingerprint, response, response_code, recovery_point)::text FROM claim_keys(ARRAY['mm-key'], ARRAY['\x02'::bytea])),
          '("\\x01",,,)', 'claim_keys: mismatch carries the stored fingerprint only');
CREATE TEMP TABLE mm_replay AS SELECT * FROM claim_key('mm-key', '\x01');
SELECT is((SELECT row(status, response, response_code, recovery_point)::text FROM mm_replay),
          '(replay,"{""charged"": 42}",201,charged)', 'replay carries the response, the code and the recovery point');

-------------------------------------------------------------------------------
-- 6. A claim's remembered row (its address in the table's file) after the file changed in
--    the claiming transaction: the completion must find the claim's row or refuse, never
--    read past the file's end nor complete another claim's row.
-------------------------------------------------------------------------------
-- CLUSTER writes a new, smaller file: the remembered address points past its end.
BEGIN;
SELECT count(claim_key('cl-fill-' || n)) FROM generate_series(1, 300) n;
SELECT token AS cl_token FROM claim_key('cl-target') \gset
SELECT cmp_ok((SELECT (ctid::text::point)[0]::int FROM idempotency_keys WHERE key = 'cl-target'), '>=', 3,
              'CLUSTER: the claim''s row is in block 3 or later');
DELETE FROM idempotency_keys WHERE key LIKE 'cl-fill-%';
CLUSTER idempotency_keys USING idempotency_keys_pkey;
SELECT is((complete_key('cl-target', :'cl_token', '{"after": "cluster"}')).status, 'replay',
          'CLUSTER in the claim''s transaction: complete_key still completes the claim');
SELECT is(row_of('cl-target'), 'completed attempts=1 code=- response={"after": "cluster"} rp=-', 'CLUSTER: the row is completed');
COMMIT;
SELECT ok(table_whole(), 'CLUSTER: heap and indexes are whole afterwards');

-- A TRUNCATE of a file this transaction created empties it in place: the remembered address
-- is past its end.
BEGIN;
TRUNCATE idempotency_keys;
SELECT count(claim_key('tt-fill-' || n)) FROM generate_series(1, 300) n;
SELECT token AS tt_token FROM claim_key('tt-target') \gset
SELECT cmp_ok((SELECT (ctid::text::point)[0]::int FROM idempotency_keys WHERE key = 'tt-target'), '>=', 3,
              'TRUNCATE twice: the claim''s row is in block 3 or later');
TRUNCATE idempotency_keys;
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'tt-target', :'tt_token', '{}'), 'P0002', NULL,
                 'TRUNCATE of a file made in the same transaction: complete_key fails with P0002');
SELECT is((SELECT count(*)::int FROM idempotency_keys), 0, 'TRUNCATE twice: nothing was written');
ROLLBACK;

-- After a TRUNCATE in place the same address holds another claim of the same key: the old
-- token must not complete the new claim.
BEGIN;
TRUNCATE idempotency_keys;
SELECT token AS reuse_old FROM claim_key('tid-reuse') \gset
TRUNCATE idempotency_keys;
SELECT token AS reuse_new FROM claim_key('tid-reuse') \gset
SELECT is((SELECT ctid::text FROM idempotency_keys WHERE key = 'tid-reuse'), '(0,1)', 'TID reuse: the new claim is at (0,1)');
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'tid-reuse', :'reuse_old', '{"by": "old"}'), '55000', NULL,
                 'TID reuse: the truncated claim''s token does not complete the new claim (55000)');
SELECT is(row_of('tid-reuse'), 'processing attempts=1 code=- response=- rp=-', 'TID reuse: the new claim is untouched');
SELECT is((complete_key('tid-reuse', :'reuse_new', '{"by": "new"}')).response, '{"by": "new"}'::jsonb,
          'TID reuse: the new claim''s token completes it');
ROLLBACK;

-- A plain TRUNCATE (a new file) between the claim and its completion.
BEGIN;
SELECT token AS tr_token FROM claim_key('tr-one') \gset
TRUNCATE idempotency_keys;
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L)', 'tr-one', :'tr_token', '{}'), 'P0002', NULL,
                 'TRUNCATE in the claim''s transaction: complete_key fails with P0002');
ROLLBACK;

-- VACUUM FULL cannot run inside a transaction: between a committed claim and its completion.
SELECT token AS vf_token FROM claim_key('vf-key') \gset
SELECT count(claim_key('vf-fill-' || n)) FROM generate_series(1, 100) n;
DELETE FROM idempotency_keys WHERE key LIKE 'vf-fill-%';
VACUUM FULL idempotency_keys;
SELECT is((complete_key('vf-key', :'vf_token', '{"after": "vacuum full"}')).status, 'replay',
          'VACUUM FULL between a claim and its completion: complete_key completes');
SELECT ok(table_whole(), 'at the end heap and indexes are whole');

SELECT * FROM finish();
