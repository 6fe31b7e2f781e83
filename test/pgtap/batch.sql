-- pgTAP: the batch functions claim_keys / complete_keys (issue #15): one row per element in
-- input order, each answered as claim_key (wait 0) / complete_key would answer it; a key
-- repeated in one batch; mixed statuses; rollback; partial completion; the single-key
-- functions' validation, limits and SQLSTATEs; per-role keys; no lock kept per key.
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(58);

-- The statuses of a batch, in the order of its rows, as one text: 'claimed,replay,...'.
CREATE FUNCTION statuses(rows_ text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE result text;
BEGIN
  EXECUTE format('SELECT string_agg(status::text, %L ORDER BY ordinality) FROM (%s) b', ',', rows_)
    INTO result;
  RETURN result;
END
$$;

-------------------------------------------------------------------------------
-- 1. Shape: one row per key, in input order, with its ordinality and key.
-------------------------------------------------------------------------------
CREATE TEMP TABLE first_batch AS SELECT * FROM claim_keys(ARRAY['b-3', 'b-1', 'b-2']);
SELECT is((SELECT string_agg(ordinality || ':' || key, ',' ORDER BY ordinality) FROM first_batch),
          '1:b-3,2:b-1,3:b-2', 'one row per key, in input order, with ordinality and key');
SELECT is((SELECT count(*)::int FROM first_batch WHERE status = 'claimed' AND token IS NOT NULL AND attempts = 1),
          3, 'new keys are claimed, each with a token and attempts 1');
SELECT is((SELECT count(DISTINCT token)::int FROM first_batch), 3, 'each claim has its own token');
SELECT is((SELECT array_agg(key ORDER BY key) FROM idempotency_keys WHERE key LIKE 'b-%'),
          ARRAY['b-1', 'b-2', 'b-3'], 'the rows are stored');
SELECT is((SELECT count(*)::int FROM claim_keys('{}')), 0, 'an empty batch gives no rows');
SELECT is((SELECT string_agg(ordinality::text, ',') FROM claim_keys(ARRAY['b-1'])), '1',
          'a batch of one');
SELECT is((SELECT pg_typeof(x)::text FROM (SELECT (claim_keys(ARRAY['b-tl'])).status AS x) s), 'claim_status',
          'callable in a select list too');

-------------------------------------------------------------------------------
-- 2. A key repeated in one batch: the first occurrence decides, the later ones get what a
--    duplicate gets.
-------------------------------------------------------------------------------
BEGIN;
CREATE TEMP TABLE dup AS SELECT * FROM claim_keys(ARRAY['d-1', 'd-2', 'd-1', 'd-1']);
SELECT is((SELECT string_agg(status::text, ',' ORDER BY ordinality) FROM dup),
          'claimed,claimed,in_progress,in_progress', 'repeated key: first claimed, later in_progress');
SELECT ok((SELECT bool_and(token IS NULL AND retry_after > '0') FROM dup WHERE ordinality IN (3, 4)),
          'the later occurrences carry no token and a retry_after');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key = 'd-1'), 1, 'one row for the repeated key');
SELECT is((SELECT attempts FROM idempotency_keys WHERE key = 'd-1'), 1, 'claimed once');
SELECT is((SELECT string_agg(status::text, ',' ORDER BY ordinality)
             FROM complete_keys(ARRAY['d-1', 'd-1'],
                                ARRAY[(SELECT token FROM dup WHERE ordinality = 1), (SELECT token FROM dup WHERE ordinality = 1)],
                                ARRAY['{"n": 1}', '{"n": 1}']::jsonb[])),
          'replay,replay', 'the same completion twice in one batch: the second is a no-op');
COMMIT;
SELECT is(statuses($$SELECT * FROM claim_keys(ARRAY['d-1', 'd-1'])$$), 'replay,replay',
          'a completed key repeated in a batch: replay for each occurrence');
SELECT is((SELECT string_agg(response::text, ',' ORDER BY ordinality) FROM claim_keys(ARRAY['d-1', 'd-1'])),
          '{"n": 1},{"n": 1}', 'with the stored response each time');

-------------------------------------------------------------------------------
-- 3. Mixed statuses in one batch.
-------------------------------------------------------------------------------
SELECT complete_key('m-replay', (claim_key('m-replay', '\x01')).token, '{"r": 1}', 201);
SELECT complete_key('m-mismatch', (claim_key('m-mismatch', '\x01')).token, '{"r": 2}');
SELECT claim_key('m-held', NULL, '', NULL, '1 hour');
SELECT release_key('m-released', (claim_key('m-released')).token);
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at, status, attempts)
  VALUES ('m-expired', current_user, '1 hour', '5 min', now() - interval '2 hours',
          now() - interval '1 hour', now(), 'completed', 1);
CREATE TEMP TABLE mixed AS
  SELECT * FROM claim_keys(ARRAY['m-new', 'm-replay', 'm-mismatch', 'm-held', 'm-released', 'm-expired'],
                           ARRAY['\x01', '\x01', '\x02', NULL, NULL, NULL]::bytea[]);
SELECT is((SELECT string_agg(status::text, ',' ORDER BY ordinality) FROM mixed),
          'claimed,replay,mismatch,in_progress,reclaimed,claimed', 'mixed statuses, each as claim_key answers');
SELECT is((SELECT row(response, response_code)::text FROM mixed WHERE key = 'm-replay'), '("{""r"": 1}",201)',
          'replay carries the response and code');
SELECT is((SELECT row(response IS NULL, fingerprint)::text FROM mixed WHERE key = 'm-mismatch'), '(t,"\\x01")',
          'mismatch: the stored fingerprint and no response');
SELECT is((SELECT attempts FROM mixed WHERE key = 'm-released'), 2, 'reclaimed: attempts + 1');
SELECT is((SELECT attempts FROM mixed WHERE key = 'm-expired'), 1, 'an expired key is claimed afresh');
SELECT is((SELECT fingerprint FROM idempotency_keys WHERE key = 'm-new'), '\x01'::bytea,
          'fingerprints[i] is stored with keys[i]');

-------------------------------------------------------------------------------
-- 4. A batch in a transaction that rolls back: nothing stays.
-------------------------------------------------------------------------------
BEGIN;
SELECT is(statuses($$SELECT * FROM claim_keys(ARRAY['rb-1', 'rb-2', 'rb-3'])$$), 'claimed,claimed,claimed',
          'a batch in a transaction');
ROLLBACK;
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'rb-%'), 0, 'rolled back: no row stays');
SELECT is(statuses($$SELECT * FROM claim_keys(ARRAY['rb-1', 'rb-2', 'rb-3'])$$), 'claimed,claimed,claimed',
          'and the keys are claimed afresh');
BEGIN;
SAVEPOINT s;
SELECT is(statuses($$SELECT * FROM claim_keys(ARRAY['sp-1', 'sp-2'])$$), 'claimed,claimed', 'a batch after a savepoint');
ROLLBACK TO SAVEPOINT s;
SELECT is(statuses($$SELECT * FROM claim_keys(ARRAY['sp-2', 'sp-1'])$$), 'claimed,claimed',
          'rolled back to the savepoint: claimed again in the same transaction');
COMMIT;

-------------------------------------------------------------------------------
-- 5. A batch completed partly (two-phase: claims committed, some outcomes stored later).
-------------------------------------------------------------------------------
CREATE TEMP TABLE part AS SELECT * FROM claim_keys(ARRAY['p-1', 'p-2', 'p-3', 'p-4']);
CREATE TEMP TABLE part_done AS
  SELECT * FROM complete_keys(ARRAY['p-3', 'p-1'],
                              ARRAY[(SELECT token FROM part WHERE key = 'p-3'), (SELECT token FROM part WHERE key = 'p-1')],
                              ARRAY['{"k": 3}', NULL]::jsonb[], ARRAY[200, 204]);
SELECT is((SELECT string_agg(ordinality || ':' || key || ':' || status || ':' || coalesce(response::text, '-') || ':' || response_code, ','
                             ORDER BY ordinality) FROM part_done),
          '1:p-3:replay:{"k": 3}:200,2:p-1:replay:-:204', 'complete_keys: one replay row per element, in input order');
SELECT is(statuses($$SELECT * FROM claim_keys(ARRAY['p-1', 'p-2', 'p-3', 'p-4'])$$), 'replay,in_progress,replay,in_progress',
          'the completed keys replay, the others are still held');
SELECT is((SELECT release_key('p-2', token)::text FROM part WHERE key = 'p-2'), '', 'one of the rest is released');
SELECT is(statuses($$SELECT * FROM complete_keys(ARRAY['p-4'], ARRAY[(SELECT token FROM part WHERE key = 'p-4')], NULL)$$),
          'replay', 'another is completed later, without responses (NULL array)');
SELECT is((SELECT response_code FROM idempotency_keys WHERE key = 'p-4'), NULL, 'response_codes NULL: no code');

-------------------------------------------------------------------------------
-- 6. Fencing: one refused element fails the whole call, which changes nothing.
-------------------------------------------------------------------------------
CREATE TEMP TABLE fence AS SELECT * FROM claim_keys(ARRAY['f-1', 'f-2']);
SELECT throws_ok($$SELECT * FROM complete_keys(ARRAY['f-1', 'f-2'],
                     ARRAY[(SELECT token FROM fence WHERE key = 'f-1'), '018f0000-0000-7000-8000-000000000000'],
                     ARRAY['{}', '{}']::jsonb[])$$,
                 '55000', NULL, 'a token that does not hold its key: 55000');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'f-%' AND status = 'processing'), 2,
          'and the other element was not completed either');
SELECT throws_ok($$SELECT * FROM complete_keys(ARRAY['f-none'], ARRAY['018f0000-0000-7000-8000-000000000000'::uuid], ARRAY['{}']::jsonb[])$$,
                 'P0002', NULL, 'an unknown key: P0002');
SELECT throws_like($$SELECT * FROM complete_keys(ARRAY['f-1', 'f-none'],
                     ARRAY[(SELECT token FROM fence WHERE key = 'f-1'), '018f0000-0000-7000-8000-000000000000'],
                     ARRAY['{}', '{}']::jsonb[])$$,
                   '%does not exist%', 'the error names the key');

-------------------------------------------------------------------------------
-- 7. Validation: the single-key functions' SQLSTATEs.
-------------------------------------------------------------------------------
-- Every element is checked before any is claimed or completed: a batch whose last element is
-- bad claims nothing, not even for a moment (the statistics, which a rollback does not undo,
-- count no claim or completion).
-- C++ edition only, from here (shared-memory statistics; the portable edition has no counters a rollback leaves)
CREATE TEMP TABLE counted_before AS
  SELECT claimed, completed FROM idempotency_stats WHERE datname = current_database();
-- C++ edition only, to here
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['last-bad-1', 'last-bad-2', ''])$$, '22023', NULL,
                 'a batch whose last key is empty: 22023');
-- C++ edition only, from here (shared-memory statistics; the portable edition has no counters a rollback leaves)
SELECT is((SELECT s.claimed - b.claimed FROM idempotency_stats s, counted_before b
            WHERE s.datname = current_database()), 0::bigint,
          'and no element of it was claimed first (no claim counted)');
-- C++ edition only, to here
CREATE TEMP TABLE last_bad AS SELECT * FROM claim_keys(ARRAY['last-bad-1', 'last-bad-2']);
SELECT throws_ok($$SELECT * FROM complete_keys(ARRAY['last-bad-1', 'last-bad-2'],
                                               (SELECT array_agg(token ORDER BY ordinality) FROM last_bad),
                                               ARRAY['{}', '{}']::jsonb[], NULL, '', NULL,
                                               ARRAY['{}', '{"Bad Name": "x"}']::jsonb[])$$,
                 '22023', NULL, 'a completion batch whose last headers are bad: 22023');
-- C++ edition only, from here (shared-memory statistics; the portable edition has no counters a rollback leaves)
SELECT is((SELECT s.completed - b.completed FROM idempotency_stats s, counted_before b
            WHERE s.datname = current_database()), 0::bigint,
          'and no element of it was completed first (no completion counted)');
-- C++ edition only, to here
SELECT throws_ok($$SELECT * FROM claim_keys(NULL)$$, '22004', NULL, 'keys NULL: 22004');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['v-1', NULL])$$, '22004', NULL, 'a NULL key: 22004');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['v-1', ''])$$, '22023', NULL, 'an empty key: 22023');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['v-1', repeat('x', 256)])$$, '22001', NULL, 'a key over the limit: 22001');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['v-1'], scope => NULL)$$, '22004', NULL, 'scope NULL: 22004');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY[['v-1'], ['v-2']])$$, '2202E', NULL, 'a two-dimensional array: 2202E');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['v-1', 'v-2'], ARRAY['\x01']::bytea[])$$, '2202E', NULL,
                 'fingerprints of another length: 2202E');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['v-1'], ttl => '-1 hour')$$, '22023', NULL, 'a negative ttl: 22023');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['v-1'], lease => '0')$$, '22023', NULL, 'a zero lease: 22023');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['v-1'], ARRAY[decode(repeat('00', 1025), 'hex')])$$, '22001', NULL,
                 'a fingerprint over the limit: 22001');
SELECT throws_ok($$SELECT * FROM complete_keys(ARRAY['f-1', 'f-2'], ARRAY[gen_uuid_v7()], ARRAY['{}', '{}']::jsonb[])$$,
                 '2202E', NULL, 'tokens of another length: 2202E');
SELECT throws_ok($$SELECT * FROM complete_keys(ARRAY['f-1'], NULL, ARRAY['{}']::jsonb[])$$, '22004', NULL, 'tokens NULL: 22004');
SELECT throws_ok($$SELECT * FROM complete_keys(ARRAY['f-1'], ARRAY[NULL]::uuid[], ARRAY['{}']::jsonb[])$$, '22004', NULL,
                 'a NULL token: 22004');
SELECT throws_ok($$SELECT * FROM complete_keys(ARRAY['f-1'], ARRAY[(SELECT token FROM fence WHERE key = 'f-1')],
                     ARRAY[jsonb_build_object('big', repeat('x', 2000000))])$$, '54000', NULL, 'a response over the limit: 54000');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'v-%'), 0, 'refused batches wrote nothing');

-------------------------------------------------------------------------------
-- 8. Security and locks: SECURITY INVOKER, keys per role, no lock per key.
-------------------------------------------------------------------------------
SELECT is((SELECT bool_or(prosecdef) FROM pg_proc WHERE proname IN ('claim_keys', 'complete_keys')), false,
          'both functions are SECURITY INVOKER');
CREATE ROLE batch_app;
GRANT USAGE ON SCHEMA idempotency TO batch_app;
SET ROLE batch_app;
SELECT is(statuses($$SELECT * FROM idempotency.claim_keys(ARRAY['b-1', 'b-2'])$$), 'claimed,claimed',
          'another role''s batch of the same keys: its own keys');
RESET ROLE;
SELECT is((SELECT owner::text FROM idempotency_keys WHERE key = 'b-1' ORDER BY owner::text LIMIT 1), 'batch_app',
          'owned by the calling role');
BEGIN;
SELECT is((SELECT count(*)::int FROM claim_keys(ARRAY(SELECT 'lk-' || g FROM generate_series(1, 2000) g)) WHERE status = 'claimed'),
          2000, '2000 keys claimed in one call');
-- C++ edition only, from here (the portable edition holds a key lock per claim: SECURITY.md)
SELECT is((SELECT count(*)::int FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'), 0,
          'and no key lock is held for them');
-- C++ edition only, to here
COMMIT;

SELECT * FROM finish();
