-- pgTAP: the six places where an outside review found the direct heap/index path
-- (src/key_heap.cpp) answering differently from INSERT / UPDATE through the executor, and
-- the message of a token that was never issued. Each block failed before the fix. Two of
-- them (a default, an identity column) are refused since 1.2 before anything is written.
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed, as a superuser
-- (the extension owner), which may alter the table; every change is rolled back.
-- Edition: C++ only: the direct heap path.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;
SET search_path = public, idempotency;

SELECT plan(19);

-- The value `statement` returns, or 'ERROR ' and the SQLSTATE it raises.
CREATE FUNCTION outcome(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  result text;
BEGIN
  EXECUTE statement INTO result;
  RETURN result;
EXCEPTION WHEN OTHERS THEN
  RETURN 'ERROR ' || SQLSTATE;
END
$$;

-- The DETAIL of the error `statement` raises.
CREATE FUNCTION error_detail(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  detail text;
BEGIN
  EXECUTE statement;
  RETURN NULL;
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
  RETURN detail;
END
$$;

-- 1. A second TRUNCATE in one transaction empties in place the file the first one made:
-- the completion of a claim whose row was on block 1 must not read past the file's end.
BEGIN;
TRUNCATE idempotency_keys;
CREATE TEMP TABLE claims AS
  SELECT n, (claim_key('trunc-' || n)).token FROM generate_series(1, 120) n;
SELECT cmp_ok((SELECT count(DISTINCT (ctid::text::point)[0]) FROM idempotency_keys)::int, '>', 1,
              'truncate: the claims fill more than one block');
-- A claim on block 1 that this transaction remembers (the first 64 claims of a statement).
SELECT c.n AS on_block_1 FROM claims c JOIN idempotency_keys k ON k.key = 'trunc-' || c.n
 WHERE (k.ctid::text::point)[0] = 1 AND c.n <= 64 ORDER BY c.n LIMIT 1 \gset
TRUNCATE idempotency_keys;
SELECT throws_ok(format($$SELECT complete_key('trunc-%s', %L, '{}')$$, :on_block_1,
                        (SELECT token FROM claims WHERE n = :on_block_1)),
                 'P0002', NULL, 'truncate twice: complete_key answers P0002, as the executor does');
ROLLBACK;

-- 2. A default on a column the claim's INSERT leaves out was the executor's to fill in; since
-- 1.2 a default the install script did not make is code that would run as the owner, and
-- every call refuses it (42501) before writing anything (issue #20, SECURITY.md).
BEGIN;
ALTER TABLE idempotency_keys ALTER COLUMN recovery_point SET DEFAULT 'step-0',
                             ALTER COLUMN response_code SET DEFAULT 202,
                             ALTER COLUMN response SET DEFAULT '{"pending": true}';
SELECT throws_ok($$SELECT claim_key('default-1')$$, '42501',
                 'column "recovery_point" of table idempotency_keys of extension idempotency has a default that the extension did not give it',
                 'defaults: a claim is refused (42501)');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key = 'default-1'), 0, 'defaults: and writes nothing');
ROLLBACK;
BEGIN;
ALTER TABLE idempotency_keys DROP COLUMN recovery_point;
ALTER TABLE idempotency_keys ADD COLUMN recovery_point text DEFAULT 'again';
SELECT throws_ok($$SELECT claim_key('default-2')$$, '42501', NULL,
                 'defaults: a column dropped and added again with a default is refused too');
ROLLBACK;

-- 3. Enum labels: a backend that cached the label OIDs must not write an old label after
-- ALTER TYPE ... RENAME VALUE (it refuses instead), and works again once the name is back.
SELECT is((claim_key('enum-1')).status::text, 'claimed', 'enum: the labels are cached');
BEGIN;
-- Claimed in this transaction: the completion would be the direct path's update in place.
SELECT (claim_key('enum-3')).token AS enum_token \gset
ALTER TYPE key_status RENAME VALUE 'completed' TO 'done';
SELECT throws_like(format($$SELECT complete_key('enum-3', %L, '{}')$$, :'enum_token'),
                   '%"completed"%',
                   'enum: a renamed label is refused, never written under its new name');
ROLLBACK;
-- The executor path's statements name the labels too: they are prepared again after the
-- rename (and refuse), not run with the OIDs they were prepared with.
BEGIN;
SET LOCAL idempotency.executor_path = on;
SELECT (claim_key('enum-4')).token AS enum_token_4 \gset
ALTER TYPE key_status RENAME VALUE 'completed' TO 'done';
SELECT throws_like(format($$SELECT complete_key('enum-4', %L, '{}')$$, :'enum_token_4'),
                   '%"completed"%',
                   'enum, on the executor path: a renamed label is refused, never written under its new name');
ROLLBACK;
-- Two labels that swap names: the statements, prepared again, write the label now named
-- 'processing' for a claim and 'completed' for a completion (kept, they would write the OIDs
-- of the old names: a claim stored as completed, a completion as processing).
BEGIN;
SET LOCAL idempotency.executor_path = on;
SELECT status FROM claim_key('enum-5') \gset
ALTER TYPE key_status RENAME VALUE 'completed' TO 'swapping';
ALTER TYPE key_status RENAME VALUE 'processing' TO 'completed';
ALTER TYPE key_status RENAME VALUE 'swapping' TO 'processing';
SELECT (claim_key('enum-6')).token AS enum_token_6 \gset
SELECT is((SELECT status::text FROM idempotency_keys WHERE key = 'enum-6'), 'processing',
          'enum, labels swapped, on the executor path: a claim is stored as processing');
SELECT complete_key('enum-6', :'enum_token_6', '{}') \gset
SELECT is((SELECT status::text FROM idempotency_keys WHERE key = 'enum-6'), 'completed',
          'and its completion as completed');
ROLLBACK;
BEGIN;
ALTER TYPE claim_status RENAME VALUE 'replay' TO 'replayed';
SELECT throws_like($$SELECT claim_key('enum-1')$$, '%claim_status has no label "replay"%',
                   'enum: a renamed result label is refused');
ROLLBACK;
SELECT is((claim_key('enum-2')).status::text, 'claimed', 'enum: the original names work again');

-- 4. The direct read checks no privilege of the caller: every call acts as the extension
-- owner (src/caller.hpp). An application role with no right on the table claims and replays.
CREATE ROLE divergence_app;
GRANT USAGE ON SCHEMA idempotency TO divergence_app;
SET ROLE divergence_app;
SELECT is((idempotency.claim_key('priv-1')).status::text, 'claimed',
          'rights: a role without any right on the table claims');
SELECT throws_ok('SELECT * FROM idempotency.idempotency_keys', '42501', NULL,
                 'rights: but cannot read the table itself');
RESET ROLE;

-- 5. Another unique index over the key's columns (here with a case-insensitive collation) is
-- an arbiter of the executor's INSERT .. ON CONFLICT: the direct path must not answer 23505.
-- (Needs ICU for a nondeterministic collation; a server built without it skips the block.)
DO $$
BEGIN
  CREATE COLLATION divergence_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
EXCEPTION WHEN feature_not_supported THEN NULL;
END
$$;
SELECT EXISTS (SELECT FROM pg_collation WHERE collname = 'divergence_ci') AS has_icu \gset
\if :has_icu
BEGIN;
CREATE UNIQUE INDEX divergence_ci_key ON idempotency_keys (owner, scope, key COLLATE divergence_ci);
SELECT is((claim_key('Order-1')).status::text, 'claimed', 'unique index: the first key is claimed');
SELECT is(outcome($$SELECT (claim_key('order-1')).status::text$$), 'in_progress',
          'unique index: a key equal under the other index answers in_progress, not 23505');
ROLLBACK;
\else
SELECT skip('this server has no ICU collations', 2);
\endif

-- 6. attempts made an identity column: the executor refused to write it (428C9), and so did
-- the claim; since 1.2 the table is refused before any write (42501).
BEGIN;
ALTER TABLE idempotency_keys ALTER COLUMN attempts DROP DEFAULT;
ALTER TABLE idempotency_keys ALTER COLUMN attempts ADD GENERATED ALWAYS AS IDENTITY;
SELECT throws_ok($$SELECT claim_key('identity-1')$$, '42501',
                 'column "attempts" of table idempotency_keys of extension idempotency is an identity column',
                 'identity: the claim is refused (42501)');
ROLLBACK;

-- 9. A token that was never issued for the key says so (not "its lease ended").
SELECT throws_ok($$SELECT complete_key('enum-2', '00000000-0000-0000-0000-000000000000', '{}')$$,
                 '55000', NULL, 'a never-issued token is refused (55000)');
SELECT alike(error_detail($$SELECT complete_key('enum-2', '00000000-0000-0000-0000-000000000000', '{}')$$),
            'This token was never issued for this key%', 'and its DETAIL says it was never issued');

SELECT * FROM finish();
DROP OWNED BY divergence_app;
DROP ROLE divergence_app;
