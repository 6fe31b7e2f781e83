-- pgTAP: each layout of idempotency_keys that the direct path leaves to the executor
-- (src/key_layout.cpp, route::ExecutorReason), one at a time: the claims of such a table go
-- through the executor (the observable: only the executor path takes a per-key lock for a new
-- key), and the table gets what the executor does there and the direct path would not (a NOT
-- NULL of a user's column, a typmod's rounding, every index's entries, an exclusion
-- constraint). The reasons not here cannot be reached from SQL: the installation check
-- refuses their tables first (test/pgtap/security_checks.sql; test/mutants/mutants.txt says
-- which). Run by test/run.sh in a fresh database with pgtap and idempotency installed.
-- Edition: C++ only: the choice between the direct heap path and the executor.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;
CREATE EXTENSION amcheck;

SELECT plan(23);

\ir include/indexes_whole.sql

-- The key locks (advisory locks in pg_locks) that a claim of a new key `key` holds in its
-- transaction: 1 on the executor path, 0 on the direct path. The claim is rolled back.
CREATE FUNCTION key_locks_of_claim(key text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
  held int;
BEGIN
  BEGIN
    PERFORM claim_key(key);
    SELECT count(*) INTO held FROM pg_locks
     WHERE pid = pg_backend_pid() AND locktype = 'advisory';
    RAISE SQLSTATE 'PX001';
  EXCEPTION WHEN SQLSTATE 'PX001' THEN NULL;
  END;
  RETURN held;
END
$$;

SELECT is(key_locks_of_claim('plain'), 0, 'the table as installed: the direct path (no key lock)');

-- A column of the user's (kUserColumn): the executor writes it, as NULL, and enforces its
-- NOT NULL; the direct path would store the NULL.
ALTER TABLE idempotency_keys ADD COLUMN tenant text;
SELECT is(key_locks_of_claim('user-column'), 1, 'a column of the user''s: the executor writes');
BEGIN;
ALTER TABLE idempotency_keys ALTER COLUMN tenant SET NOT NULL;
SELECT throws_ok($$SELECT claim_key('user-column-not-null')$$, '23502', NULL,
                 'a NOT NULL column of the user''s without a default: 23502, no row without it');
ROLLBACK;
ALTER TABLE idempotency_keys DROP COLUMN tenant;

-- More columns than the direct path keeps track of, dropped ones included (kNotHeapTable):
-- the executor writes; the rows read back right and every index stays whole. (Rolled back:
-- a dropped column stays in the table.)
BEGIN;
DO $$BEGIN
  FOR n IN 1..60 LOOP
    EXECUTE format('ALTER TABLE idempotency_keys ADD COLUMN extra_%s int', n);
    EXECUTE format('ALTER TABLE idempotency_keys DROP COLUMN extra_%s', n);
  END LOOP;
END$$;
SELECT cmp_ok((SELECT relnatts::int FROM pg_class WHERE oid = 'idempotency_keys'::regclass), '>', 64,
              'over 64 columns, live and dropped');
SELECT is(key_locks_of_claim('wide'), 1, 'a table of over 64 columns: the executor writes');
SELECT is((SELECT status::text FROM complete_key('wide-1', (claim_key('wide-1')).token, '{"w": 1}')),
          'replay', 'a claim and its completion in the wide table');
SELECT is((SELECT status::text || ' ' || response::text FROM claim_key('wide-1')), 'replay {"w": 1}',
          'read back right');
SELECT ok(indexes_whole(), 'and every index holds every row');
ROLLBACK;

-- A typmod (kTypmod): timestamptz(0) keeps whole seconds, which the executor's coercion
-- rounds to; the direct path would store the microseconds.
ALTER TABLE idempotency_keys ALTER COLUMN created_at TYPE timestamptz(0);
SELECT is(key_locks_of_claim('typmod'), 1, 'a column with a typmod: the executor writes');
SELECT is((SELECT status::text FROM claim_key('typmod-1')), 'claimed', 'a claim with created_at timestamptz(0)');
SELECT is((SELECT created_at = date_trunc('second', created_at) FROM idempotency_keys WHERE key = 'typmod-1'),
          true, 'created_at stored in whole seconds (the typmod applied)');
DELETE FROM idempotency_keys;
ALTER TABLE idempotency_keys ALTER COLUMN created_at TYPE timestamptz;

-- A NOT NULL added to one of our columns (kExtraNotNull) is in test/pgtap/direct_path.sql.

-- More indexes than the direct path keeps (kIndexKind, 32): the executor writes, and the
-- last index gets its entries too.
DO $$BEGIN
  FOR n IN 1..32 LOOP
    EXECUTE format('CREATE INDEX extra_index_%s ON idempotency_keys (created_at, updated_at)', n);
  END LOOP;
END$$;
SELECT is(key_locks_of_claim('indexes'), 1, 'over 32 indexes: the executor writes');
SELECT is((SELECT status::text FROM complete_key('indexes-1', (claim_key('indexes-1')).token, '{}')),
          'replay', 'a claim and its completion with 33 indexes');
SELECT ok(indexes_whole(), 'every one of the 33 indexes holds every row');
DO $$BEGIN
  FOR n IN 1..32 LOOP
    EXECUTE format('DROP INDEX extra_index_%s', n);
  END LOOP;
END$$;

-- An exclusion constraint (kIndexKind): the executor checks it; the direct path would only
-- add the index entry. Here one key per scope, whoever the role.
ALTER TABLE idempotency_keys ADD CONSTRAINT one_owner_per_key EXCLUDE USING btree (key WITH =, scope WITH =);
SELECT is(key_locks_of_claim('exclusion'), 1, 'an exclusion constraint: the executor writes');
SELECT is((SELECT status::text FROM claim_key('shared')), 'claimed', 'a key claimed by one role');
CREATE ROLE executor_reasons_other;
GRANT USAGE ON SCHEMA idempotency TO executor_reasons_other;
SET ROLE executor_reasons_other;
SELECT throws_ok($$SELECT claim_key('shared')$$, '23P01', NULL,
                 'the same key of another role: 23P01 from the exclusion constraint');
RESET ROLE;
SELECT ok(indexes_whole(), 'and every index holds every row');
ALTER TABLE idempotency_keys DROP CONSTRAINT one_owner_per_key;

-- A unique index besides the primary key (kOtherUniqueIndex): the executor writes (it checks
-- every unique index, and takes one on the key's columns as an arbiter).
CREATE UNIQUE INDEX one_key_per_owner ON idempotency_keys (owner, key);
SELECT is(key_locks_of_claim('unique'), 1, 'another unique index: the executor writes');
SELECT is((SELECT status::text FROM claim_key('unique-1', scope => 'a')), 'claimed', 'a key in scope a');
SELECT throws_ok($$SELECT claim_key('unique-1', scope => 'b')$$, '23505', NULL,
                 'the same key in scope b: 23505 from the other unique index');
DROP INDEX one_key_per_owner;

-- A hash index (kIndexKind) is in test/pgtap/direct_path.sql.

SELECT is(key_locks_of_claim('plain-again'), 0, 'the table as installed again: the direct path');
SELECT ok(indexes_whole(), 'at the end every index holds every row');
SELECT * FROM finish();
