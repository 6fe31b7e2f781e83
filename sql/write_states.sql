-- The direct path keeps a BRIN's insert state (the expiry index of 16 and later) from one
-- write to the next in a transaction, its pins held by the top resource owner: reused after
-- a savepoint's rollback and after an error, released at commit and at rollback (no WARNING of
-- a leaked buffer pin), and dropped when the index is rebuilt in the same transaction (a
-- state kept past that would write into the old file). On 15 (a B-Tree) the same statements
-- give the same answers.
SET client_min_messages = warning;
BEGIN;
SELECT status FROM claim_key('brin-state-1');
SAVEPOINT s;
SELECT status FROM claim_key('brin-state-2');
ROLLBACK TO SAVEPOINT s;
SELECT status FROM claim_key('brin-state-3');
SAVEPOINT t;
SELECT status FROM claim_key('brin-state-3', ttl => interval '-1 second');
ROLLBACK TO SAVEPOINT t;
SELECT c.status FROM claim_key('brin-state-4') cl,
       LATERAL complete_key('brin-state-4', cl.token, '{"ok": 4}'::jsonb, 200) c;
COMMIT;
BEGIN;
SELECT status FROM claim_key('brin-state-5');
ROLLBACK;
BEGIN;
SELECT status FROM claim_key('brin-state-6');
REINDEX INDEX idempotency_keys_expires_at_idx;
SELECT c.status FROM claim_key('brin-state-7') cl,
       LATERAL complete_key('brin-state-7', cl.token, '{"ok": 7}'::jsonb, 200) c;
COMMIT;
BEGIN;
SELECT status FROM claim_key('brin-state-8');
DROP INDEX idempotency_keys_expires_at_idx;
SELECT status FROM claim_key('brin-state-9');
ROLLBACK;
SELECT status FROM claim_key('brin-state-10');
SELECT key, status FROM idempotency_keys WHERE key LIKE 'brin-state-%' ORDER BY key COLLATE "C";
-- every key is found through the expiry index by its own expiry (16+: by its bucket)
SET enable_seqscan = off;
SELECT count(*) AS found_by_index FROM idempotency_keys
 WHERE key LIKE 'brin-state-%'
   AND expiry_bucket(expires_at) >= expiry_bucket(now() - interval '1 hour')
   AND expires_at >= now() - interval '1 hour';
RESET enable_seqscan;
DELETE FROM idempotency_keys WHERE key LIKE 'brin-state-%';
