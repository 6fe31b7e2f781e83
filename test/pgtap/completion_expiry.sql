-- pgTAP: a completed key lives ttl after its completion (SPEC sections 2 and 3.2), in the
-- inbox pattern (claim, work, complete, COMMIT in one transaction) as in the two-phase one,
-- for complete_key and complete_keys (issue #21 item 1). 1.1 kept the claim's expiry in the
-- inbox pattern: a transaction longer than the ttl committed a key that had already expired,
-- and the redelivery right after got `claimed` and ran the effect again.
-- On every path: the direct completion (the row found by its address) and the executor's.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(13);

-- Inbox: the work takes longer than the ttl.
BEGIN;
CREATE TEMP TABLE c1 AS SELECT * FROM idempotency.claim_key('inbox-slow', ttl => '2 s', lease => '1 min');
SELECT pg_sleep(2.2);
CREATE TEMP TABLE done1 AS
  SELECT *, clock_timestamp() AS completed_at
    FROM idempotency.complete_key('inbox-slow', (SELECT token FROM c1), '{"paid": true}'::jsonb, 200);
SELECT ok((SELECT expires_at > completed_at FROM done1), 'inbox: complete_key returns an expiry in the future');
SELECT cmp_ok((SELECT expires_at - completed_at FROM done1), '>', interval '1.5 s',
              'inbox: about ttl after the completion');
SELECT ok((SELECT expires_at <= completed_at + interval '2 s' FROM done1), 'inbox: not more than ttl after it');
COMMIT;
SELECT is((SELECT status::text || ' ' || response::text FROM idempotency.claim_key('inbox-slow')),
          'replay {"paid": true}', 'inbox: the redelivery right after COMMIT replays (it ran the effect again in 1.1)');
SELECT is((SELECT expires_at FROM idempotency.idempotency_keys WHERE key = 'inbox-slow'),
          (SELECT expires_at FROM done1), 'inbox: the stored expiry is the one complete_key returned');
SELECT is((SELECT expires_at - updated_at FROM idempotency.idempotency_keys WHERE key = 'inbox-slow'),
          interval '2 s', 'inbox: stored as completion time + ttl');

-- Two-phase: the claim commits, the completion comes later.
CREATE TEMP TABLE c2 AS SELECT * FROM idempotency.claim_key('two-phase-slow', ttl => '2 s', lease => '1 min');
SELECT pg_sleep(2.2);
CREATE TEMP TABLE done2 AS
  SELECT *, clock_timestamp() AS completed_at
    FROM idempotency.complete_key('two-phase-slow', (SELECT token FROM c2), '{"paid": 2}'::jsonb);
SELECT ok((SELECT expires_at > completed_at FROM done2), 'two-phase: an expiry in the future');
SELECT is((SELECT status::text FROM idempotency.claim_key('two-phase-slow')), 'replay', 'two-phase: replay');
SELECT is((SELECT expires_at - updated_at FROM idempotency.idempotency_keys WHERE key = 'two-phase-slow'),
          interval '2 s', 'two-phase: stored as completion time + ttl (not the claim''s expiry, the end of its lease)');

-- complete_keys in the claiming transaction.
BEGIN;
CREATE TEMP TABLE c3 AS SELECT * FROM idempotency.claim_keys(ARRAY['batch-slow-1', 'batch-slow-2'], ttl => '2 s', lease => '1 min');
SELECT pg_sleep(2.2);
CREATE TEMP TABLE done3 AS
  SELECT b.*, clock_timestamp() AS completed_at
    FROM idempotency.complete_keys(ARRAY['batch-slow-1', 'batch-slow-2'],
                                   (SELECT array_agg(token ORDER BY ordinality) FROM c3),
                                   ARRAY['{"n": 1}', '{"n": 2}']::jsonb[]) b;
SELECT is((SELECT count(*)::int FROM done3 WHERE expires_at > completed_at), 2,
          'complete_keys in the claiming transaction: both expire after the completion');
COMMIT;
SELECT is((SELECT string_agg(status::text, ',' ORDER BY ordinality)
             FROM idempotency.claim_keys(ARRAY['batch-slow-1', 'batch-slow-2'])),
          'replay,replay', 'complete_keys: the redelivery replays');

-- The claim's own expiry is ttl after the claim (or the end of the lease, if later).
CREATE TEMP TABLE c4 AS SELECT * FROM idempotency.claim_key('claim-expiry', ttl => '1 hour', lease => '2 hours');
SELECT is((SELECT expires_at - created_at FROM c4), interval '2 hours',
          'a processing key lives at least as long as its lease');
SELECT is((SELECT expires_at - created_at FROM idempotency.complete_key('claim-expiry', (SELECT token FROM c4), NULL)) >= interval '1 hour',
          true, 'its completion counts ttl from now');

SELECT * FROM finish();
