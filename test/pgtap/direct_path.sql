-- pgTAP: the direct heap/index path (src/key_heap.cpp) writes what the executor writes, keeps
-- every index whole, is used only where the table allows it, and honours what the executor
-- would (read-only transactions, NOT NULLs, extra columns, other indexes). Code on the table
-- (triggers, rules, CHECK constraints, defaults, computed indexes) is refused since 1.2.
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed.
-- Edition: C++ only: the direct heap path.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;
SET synchronous_commit = on;
CREATE EXTENSION amcheck;
CREATE EXTENSION pg_walinspect;

SELECT plan(74);

\ir include/indexes_whole.sql

-- Speculative-insertion confirmations (what INSERT .. ON CONFLICT writes for each new row)
-- in the WAL flushed since `start`: the direct path writes none. Only claims insert into
-- tables with ON CONFLICT here, so other activity on the server does not count.
-- Heap records of one type (INSERT, HOT_UPDATE, UPDATE, with or without +INIT) since
-- `start`; flushed at commit, since the test server runs with synchronous_commit on.
CREATE FUNCTION heap_records_since(start pg_lsn, type text) RETURNS int LANGUAGE sql AS $$
  SELECT count(*)::int FROM pg_get_wal_records_info(start, pg_current_wal_flush_lsn())
   WHERE resource_manager = 'Heap' AND (record_type = type OR record_type = type || '+INIT')
$$;
-- Which path inserted: both insert speculatively (HEAP_CONFIRM in the WAL), but only the
-- executor path takes the per-key lock first (INSERT .. ON CONFLICT would wait on an open
-- inserter); the direct path keeps no lock-manager entry per key. with_key_locks(stmt) runs
-- stmt and records how many key locks (advisory locks) its transaction then holds;
-- key_locks_taken() reads that count.
CREATE FUNCTION with_key_locks(stmt text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE stmt;
  PERFORM set_config('test.key_locks', (SELECT count(*) FROM pg_locks
     WHERE pid = pg_backend_pid() AND locktype = 'advisory')::text, false);
END
$$;
CREATE FUNCTION key_locks_taken() RETURNS int LANGUAGE sql AS $$
  SELECT current_setting('test.key_locks')::int
$$;

-------------------------------------------------------------------------------
-- 1. The direct path: the same row as the executor path, no per-key lock.
-------------------------------------------------------------------------------
SELECT pg_current_wal_insert_lsn() AS wal_start \gset
SELECT lives_ok($$SELECT with_key_locks($q$SELECT claim_key('direct-' || n, request_fingerprint('p'::text)) FROM generate_series(1, 20) n$q$)$$,
                'twenty new keys are claimed');
SELECT is(key_locks_taken(), 0, 'a new key is inserted without a per-key lock (the direct path)');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'direct-%'), 20, 'all 20 rows are there');

-- The executor path, forced by the superuser's switch, for the same claim.
SET idempotency.executor_path = on;
SELECT pg_current_wal_insert_lsn() AS wal_start \gset
SELECT lives_ok($$SELECT with_key_locks($q$SELECT claim_key('executor-1', request_fingerprint('p'::text))$q$)$$, 'a key is claimed with idempotency.executor_path on');
SELECT is(key_locks_taken(), 1, 'with idempotency.executor_path on the executor inserts, under the key lock');
RESET idempotency.executor_path;

SELECT is(
  (SELECT row(owner, fingerprint, attempts, ttl, expires_at - created_at, locked_until - created_at,
              updated_at = created_at, lease_token IS NOT NULL, recovery_point, status, response_code, response)::text
     FROM idempotency_keys WHERE key = 'direct-1'),
  (SELECT row(owner, fingerprint, attempts, ttl, expires_at - created_at, locked_until - created_at,
              updated_at = created_at, lease_token IS NOT NULL, recovery_point, status, response_code, response)::text
     FROM idempotency_keys WHERE key = 'executor-1'),
  'the direct row has the same values as the executor''s');
SELECT ok(indexes_whole(), 'after direct inserts every index holds every row');

-------------------------------------------------------------------------------
-- 2. Completion in the claim's transaction: an update of the row the claim inserted, found by
--    its address. expires_at moves to the completion time + ttl (SPEC section 2: a key lives
--    ttl after its completion, in the inbox pattern too): not HOT on 15, whose expiry index is
--    a B-Tree; HOT on 16+, whose expiry index is a BRIN (which still gets the new value).
-------------------------------------------------------------------------------
SELECT pg_current_wal_insert_lsn() AS wal_start \gset
SELECT lives_ok($$SELECT complete_key('inbox-' || n, (claim_key('inbox-' || n)).token, '{"ok": true}', 200)
                    FROM generate_series(1, 30) n$$, '30 claims and completions in one statement');
SELECT is(heap_records_since(:'wal_start', 'INSERT'), 30, 'claim + complete in one statement: 30 heap inserts');
-- On 16 and later the expiry index is a BRIN (summarizing): the same completions are HOT.
SELECT current_setting('server_version_num')::int >= 160000 AS summarizing \gset
SELECT is(heap_records_since(:'wal_start', 'UPDATE'), CASE WHEN :'summarizing'::boolean THEN 0 ELSE 30 END,
          'and 30 updates (expires_at moves: not HOT on 15; HOT on 16+, where only a BRIN covers it)');
SELECT is(array[heap_records_since(:'wal_start', 'HEAP_CONFIRM'), heap_records_since(:'wal_start', 'HOT_UPDATE')],
          array[30, CASE WHEN :'summarizing'::boolean THEN 30 ELSE 0 END],
          'and nothing else written to the heap than one confirmation per speculative insert');
SELECT is((SELECT count(*)::int FROM idempotency_keys
            WHERE key LIKE 'inbox-%' AND status = 'completed' AND response = '{"ok": true}' AND response_code = 200
              AND updated_at >= created_at AND expires_at = updated_at + ttl),
          30, 'every inbox row is completed, and expires ttl after its completion');
SELECT is((SELECT status::text || '/' || response::text FROM claim_key('inbox-7')), 'replay/{"ok": true}',
          'a later claim replays the direct completion');

-- The same across statements, as an application sends it.
BEGIN;
CREATE TEMP TABLE tx_claim AS SELECT * FROM claim_key('tx-1', request_fingerprint('a'::text));
SELECT is((SELECT status::text FROM complete_key('tx-1', (SELECT token FROM tx_claim), '{"n": 1}', 201)), 'replay',
          'complete_key in the claim''s transaction answers replay');
SELECT is((SELECT status::text FROM complete_key('tx-1', (SELECT token FROM tx_claim), '{"n": 1}', 201)), 'replay',
          'the same completion again is a no-op');
SELECT throws_ok($$SELECT complete_key('tx-1', (SELECT token FROM tx_claim), '{"n": 2}', 201)$$, '55000', NULL,
                 'another response for the completed key is refused');
COMMIT;
SELECT is((SELECT response_code FROM claim_key('tx-1', request_fingerprint('a'::text))), 201, 'stored: 201');

-- A checkpoint or a release in between moves the row (an executor UPDATE): the completion
-- then finds the remembered version gone and leaves the decision to the executor.
BEGIN;
CREATE TEMP TABLE cp_claim AS SELECT * FROM claim_key('cp-1');
SELECT lives_ok($$SELECT checkpoint_key('cp-1', (SELECT token FROM cp_claim), 'step-1')$$,
                'checkpoint in the claim''s transaction');
SELECT is((SELECT status::text FROM complete_key('cp-1', (SELECT token FROM cp_claim), '{"cp": 1}')), 'replay',
          'complete after that checkpoint succeeds');
CREATE TEMP TABLE rel_claim AS SELECT * FROM claim_key('rel-1');
SELECT lives_ok($$SELECT release_key('rel-1', (SELECT token FROM rel_claim))$$, 'release in the claim''s transaction');
SELECT throws_ok($$SELECT complete_key('rel-1', (SELECT token FROM rel_claim), '{}')$$, '55000',
                 'idempotency key "rel-1" was released', 'complete after that release is refused');
COMMIT;
SELECT is((SELECT recovery_point || ' ' || response::text FROM claim_key('cp-1')), 'step-1 {"cp": 1}',
          'the checkpointed claim replays its recovery point and response');

-- A token of this transaction does not complete another key.
BEGIN;
CREATE TEMP TABLE tx_a AS SELECT * FROM claim_key('pair-a');
CREATE TEMP TABLE tx_b AS SELECT * FROM claim_key('pair-b');
SELECT throws_ok($$SELECT complete_key('pair-b', (SELECT token FROM tx_a), '{}')$$, '55000', NULL,
                 'the token of pair-a does not complete pair-b');
SELECT throws_ok($$SELECT complete_key('pair-zzz', (SELECT token FROM tx_a), '{}')$$, 'P0002', NULL,
                 'nor a key that does not exist');
SELECT is((SELECT status::text FROM idempotency_keys WHERE key = 'pair-b'), 'processing', 'pair-b is untouched');
SELECT throws_ok($$SELECT complete_key('pair-a', (SELECT token FROM tx_a), '{}', NULL, 'other-scope')$$, 'P0002', NULL,
                 'nor the same key in another scope');
ROLLBACK;

-- A claim rolled back to a savepoint leaves nothing to complete.
BEGIN;
SAVEPOINT s;
SELECT token AS sp_token FROM claim_key('savepoint-3') \gset
ROLLBACK TO SAVEPOINT s;
SELECT throws_ok($$SELECT complete_key('savepoint-3', '$$ || :'sp_token' || $$', '{}')$$, 'P0002', NULL,
                 'completing a claim rolled back to a savepoint: the key does not exist');
SELECT is((SELECT status::text FROM claim_key('savepoint-3')), 'claimed', 'and it can be claimed again');
COMMIT;

-- More claims in one transaction than the completions kept in place (64): all complete.
BEGIN;
CREATE TEMP TABLE many_claims AS SELECT n, (claim_key('many-' || n)).token FROM generate_series(1, 150) n;
SELECT lives_ok($$SELECT complete_key('many-' || n, token, '{}') FROM many_claims$$,
                '150 claims, then their completions, in one transaction');
COMMIT;
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'many-%' AND status = 'completed'), 150,
          'all 150 completed');

-- Completions that do not fit on their page (the claims filled it first): new versions
-- elsewhere, with new index entries.
SELECT pg_current_wal_insert_lsn() AS wal_start \gset
BEGIN;
CREATE TEMP TABLE big_claims AS SELECT n, (claim_key('big-' || n)).token FROM generate_series(1, 60) n;
SELECT lives_ok($$SELECT complete_key('big-' || n, token,
                      jsonb_build_object('blob', (SELECT string_agg(md5(n::text || i::text), '') FROM generate_series(1, 40) i)))
                    FROM big_claims$$, '60 claims completed with large responses');
COMMIT;
SELECT cmp_ok(heap_records_since(:'wal_start', 'UPDATE'), '>', 0, 'large responses: some completions are not HOT');
SELECT ok(indexes_whole(), 'after non-HOT direct completions every index holds every row');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'big-%' AND status = 'completed'
            AND length(response->>'blob') = 1280), 60, 'all 60 large responses stored');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE scope = '' AND key = 'big-17'), 1,
          'a moved row is found through the primary key');
SELECT is((SELECT count(*)::int FROM idempotency_keys
            WHERE expires_at = (SELECT expires_at FROM idempotency_keys WHERE key = 'big-17') AND key = 'big-17'), 1,
          'and through the expires_at index');
RESET enable_seqscan;
RESET enable_bitmapscan;

-------------------------------------------------------------------------------
-- 3. Read-only transactions refuse the direct writes as they refuse the executor's.
-------------------------------------------------------------------------------
BEGIN READ ONLY;
SELECT throws_ok($$SELECT claim_key('read-only-1')$$, '25006', NULL, 'a claim in a read-only transaction: 25006');
ROLLBACK;
BEGIN;
CREATE TEMP TABLE ro_claim AS SELECT * FROM claim_key('read-only-2');
SET TRANSACTION READ ONLY;
SELECT throws_ok($$SELECT complete_key('read-only-2', (SELECT token FROM ro_claim), '{}')$$, '25006', NULL,
                 'a completion after SET TRANSACTION READ ONLY: 25006');
ROLLBACK;

-------------------------------------------------------------------------------
-- 4. Tables the direct path leaves to the executor.
-------------------------------------------------------------------------------
-- Triggers would fire as the extension owner, with the caller's temporary schema in reach
-- (issue #20): since 1.2 a table with one is refused (42501) before anything is written.
CREATE TABLE trigger_log (op text, key text);
CREATE FUNCTION log_change() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN INSERT INTO public.trigger_log VALUES (TG_OP, NEW.key); RETURN NEW; END$$;
CREATE TRIGGER log_change AFTER INSERT OR UPDATE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION log_change();
SELECT throws_ok($$SELECT complete_key('trig-' || n, (claim_key('trig-' || n)).token, '{}') FROM generate_series(1, 3) n$$,
                 '42501', 'table idempotency_keys of extension idempotency has trigger "log_change"',
                 'claims under a logging trigger are refused (42501)');
SELECT is((SELECT count(*)::int FROM trigger_log), 0, 'and the trigger never fires');
DROP TRIGGER log_change ON idempotency_keys;

-- CHECK constraints are code too: refused.
ALTER TABLE idempotency_keys ADD CONSTRAINT short_keys CHECK (length(key) < 12) NOT VALID;
SELECT throws_ok($$SELECT claim_key('a-rather-long-key')$$, '42501', NULL, 'a CHECK constraint added by the user is refused (42501)');
SELECT throws_ok($$SELECT claim_key('short')$$, '42501', NULL, 'for every key');
ALTER TABLE idempotency_keys DROP CONSTRAINT short_keys;

-- A NOT NULL added by the user is enforced.
BEGIN;
DELETE FROM idempotency_keys;
ALTER TABLE idempotency_keys ALTER COLUMN recovery_point SET NOT NULL;
SELECT throws_ok($$SELECT claim_key('not-null')$$, '23502', NULL, 'a NOT NULL added by the user is enforced');
ROLLBACK;

-- A column added by the user: with a default it is refused, without one the executor writes.
ALTER TABLE idempotency_keys ADD COLUMN tenant text DEFAULT 'acme';
SELECT throws_ok($$SELECT claim_key('with-tenant')$$, '42501', NULL, 'an added column with a default is refused (42501)');
ALTER TABLE idempotency_keys ALTER COLUMN tenant DROP DEFAULT;
SELECT is((SELECT status::text FROM claim_key('with-tenant')), 'claimed', 'without its default the claim is made (the executor)');
ALTER TABLE idempotency_keys DROP COLUMN tenant;

-- After the column is dropped the direct path is back (a dropped column is just NULL).
SELECT pg_current_wal_insert_lsn() AS wal_start \gset
SELECT lives_ok($$SELECT with_key_locks($q$SELECT complete_key('after-drop', (claim_key('after-drop')).token, '{"d": 1}')$q$)$$,
                'claim + complete after the column was dropped');
SELECT is(key_locks_taken(), 0, 'with the added column dropped again the direct path is used');
SELECT is((SELECT response::text FROM claim_key('after-drop')), '{"d": 1}', 'and its rows read back right');

-- Expression and partial indexes evaluate code at every insert: refused.
CREATE INDEX keys_lower ON idempotency_keys (lower(key));
SELECT throws_ok($$SELECT claim_key('EXPR-1')$$, '42501', NULL, 'a claim with an expression index is refused (42501)');
DROP INDEX keys_lower;
CREATE INDEX keys_completed ON idempotency_keys (key) WHERE status = 'completed';
SELECT throws_ok($$SELECT claim_key('EXPR-1')$$, '42501', NULL, 'a claim with a partial index is refused (42501)');
DROP INDEX keys_completed;
SELECT ok(indexes_whole(), 'the refused claims left every index whole');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'EXPR-%'), 0, 'and wrote nothing');
SELECT is((SELECT status::text FROM claim_key('EXPR-1')), 'claimed', 'without them the claim is made');

-- Rules are refused too (the executor's INSERT .. ON CONFLICT refused them before, 0A000).
CREATE TABLE rule_log (key text);
CREATE RULE log_insert AS ON INSERT TO idempotency_keys DO ALSO INSERT INTO rule_log VALUES (NEW.key);
SELECT throws_ok($$SELECT claim_key('ruled-1')$$, '42501', NULL, 'a claim under an ON INSERT rule is refused (42501)');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key = 'ruled-1'), 0, 'and writes nothing');
DROP RULE log_insert ON idempotency_keys;

-- Indexes of other access methods are maintained by the executor.
CREATE INDEX keys_hash ON idempotency_keys USING hash (key);
SELECT pg_current_wal_insert_lsn() AS wal_start \gset
SELECT lives_ok($$SELECT with_key_locks($q$SELECT complete_key('hashed-' || n, (claim_key('hashed-' || n)).token, '{}') FROM generate_series(1, 5) n$q$)$$,
                'claims and completions with a hash index');
SELECT is(key_locks_taken(), 5, 'with a hash index the executor writes');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key = 'hashed-4'), 1, 'found through the hash index');
RESET enable_seqscan;
RESET enable_bitmapscan;
DROP INDEX keys_hash;

-- A column of another type is refused, by the first look as by the writes.
BEGIN;
ALTER TABLE idempotency_keys ALTER COLUMN owner TYPE varchar COLLATE "C";
SELECT throws_ok($$SELECT claim_key('retyped')$$, '42804', 'column "owner" of idempotency_keys is not of type text',
                 'a column of another type: 42804, not a wrong row');
ROLLBACK;
SELECT is((SELECT status::text FROM claim_key('retyped')), 'claimed', 'with the type back the claim works');

-- TRUNCATE in the claim's transaction: the remembered row is gone, and complete_key says so.
BEGIN;
CREATE TEMP TABLE tr_claim AS SELECT * FROM claim_key('truncated');
TRUNCATE idempotency_keys;
SELECT throws_ok($$SELECT complete_key('truncated', (SELECT token FROM tr_claim), '{}')$$, 'P0002', NULL,
                 'complete after TRUNCATE in the same transaction: P0002');
ROLLBACK;

-- A plain index added by the user is maintained by the direct path.
CREATE INDEX keys_owner ON idempotency_keys (owner, created_at);
SELECT pg_current_wal_insert_lsn() AS wal_start \gset
SELECT lives_ok($$SELECT with_key_locks($q$SELECT complete_key('plain-' || n, (claim_key('plain-' || n)).token, '{}') FROM generate_series(1, 5) n$q$)$$,
                'claims and completions with a plain extra index');
SELECT is(key_locks_taken(), 0, 'with a plain extra index the direct path is used');
SELECT ok(indexes_whole(), 'and the extra index holds every row');
DROP INDEX keys_owner;

-------------------------------------------------------------------------------
-- 5. A table that publishes its updates needs a replica identity for them: without one the
--    direct completion refuses as the executor's UPDATE does (55000) and changes nothing.
-------------------------------------------------------------------------------
CREATE TEMP TABLE ri_committed AS SELECT * FROM claim_key('replica-identity-2');
BEGIN;
ALTER TABLE idempotency_keys REPLICA IDENTITY NOTHING;
CREATE PUBLICATION keys_updates FOR TABLE idempotency_keys WITH (publish = 'update');
CREATE TEMP TABLE ri_claim AS SELECT * FROM claim_key('replica-identity-1');
SELECT is((SELECT status::text FROM ri_claim), 'claimed', 'an insert needs no replica identity: claimed');
SELECT throws_ok($$SELECT complete_key('replica-identity-1', (SELECT token FROM ri_claim), '{}')$$, '55000', NULL,
                 'a completion in the claim''s transaction (the direct path) without a replica identity: 55000');
SELECT is((SELECT status::text FROM idempotency_keys WHERE key = 'replica-identity-1'), 'processing',
          'and the claim is unchanged');
SELECT throws_ok($$SELECT complete_key('replica-identity-2', (SELECT token FROM ri_committed), '{}')$$, '55000', NULL,
                 'a completion of a committed claim (the executor''s UPDATE): 55000');
SET LOCAL idempotency.executor_path = on;
CREATE TEMP TABLE ri_executor AS SELECT * FROM claim_key('replica-identity-3');
SELECT throws_ok($$SELECT complete_key('replica-identity-3', (SELECT token FROM ri_executor), '{}')$$, '55000', NULL,
                 'the same completion with idempotency.executor_path on: 55000');
ROLLBACK;

-------------------------------------------------------------------------------
-- 6. The direct path locks the table and the indexes it writes as the executor's INSERT and
--    UPDATE do (ROW EXCLUSIVE: CREATE INDEX and LOCK ... IN SHARE MODE wait for an open
--    claim), in the first call after the installation check ran again and in a later one.
-------------------------------------------------------------------------------
CREATE FUNCTION key_table_locks() RETURNS text LANGUAGE sql AS $$
  SELECT string_agg(c.relname || ' ' || l.mode, ', ' ORDER BY c.relname, l.mode)
    FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
   WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation'
     AND c.relnamespace = 'idempotency'::regnamespace
$$;
-- A change of the table's options makes the next call check the installation again.
ALTER TABLE idempotency_keys SET (fillfactor = 100);
BEGIN;
SELECT lives_ok($$SELECT complete_key('lock-modes-1', (claim_key('lock-modes-1')).token, '{}')$$,
                'a claim and its completion, after a change to the table');
-- (The check reads the indexes' definitions under ACCESS SHARE, and the salt of the key locks.)
SELECT is(key_table_locks(),
          'idempotency_keys RowExclusiveLock, idempotency_keys_expires_at_idx AccessShareLock, '
          'idempotency_keys_expires_at_idx RowExclusiveLock, idempotency_keys_pkey AccessShareLock, '
          'idempotency_keys_pkey RowExclusiveLock, key_lock_salt AccessShareLock',
          'the locks of a call that checked the installation: ROW EXCLUSIVE on the table, no other mode');
COMMIT;
BEGIN;
SELECT lives_ok($$SELECT complete_key('lock-modes-2', (claim_key('lock-modes-2')).token, '{}')$$,
                'a claim and its completion, the installation check cached');
SELECT is(key_table_locks(),
          'idempotency_keys RowExclusiveLock, idempotency_keys_expires_at_idx RowExclusiveLock, '
          'idempotency_keys_pkey RowExclusiveLock',
          'the locks of a later call: ROW EXCLUSIVE on the table and each index, nothing else');
COMMIT;
ALTER TABLE idempotency_keys RESET (fillfactor);

SELECT ok(indexes_whole(), 'at the end every index holds every row');
SELECT * FROM finish();
