-- pgTAP: the completion's check (the fence) is written twice, in SQL for the executor path
-- (src/key_store.cpp: kWhereKey, kWhereHolder, owned_by) and in C++ for the direct completion
-- of a claim made in the same transaction (src/key_heap_write.cpp: holds). This file proves
-- the two equal where SQL can reach the direct one: each case is run once on the direct path
-- and once with idempotency.executor_path on, on keys that differ only in their prefix, and
-- must answer the same. Where the direct check accepts, it must be the one that completed:
-- the direct completion finds the row by its address and makes no index scan, a completion
-- through the executor (or after the direct check refused) scans the primary key.
-- A side that accepts what the other refuses answers differently here; a direct side that
-- refuses what it should accept is seen by its index scans. (The row itself, written twice
-- too, is proved equal by row_identity.sql.)
-- Not reachable from SQL: a row at the claim's address that is completed, released or
-- unstamped (any write makes a new version there, which the direct check never sees).
-- Roles are cluster-wide: they carry the prefix cf_ and are dropped at the end.
-- Edition: C++ only: the direct heap path.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;
-- The executor's UPDATE finds the row by an index scan, never by a sequential one.
SET enable_seqscan = off;

SELECT plan(15);

CREATE SCHEMA cf;
GRANT USAGE ON SCHEMA cf TO PUBLIC;
-- Index scans of the primary key in this transaction so far.
CREATE FUNCTION cf.scans() RETURNS bigint LANGUAGE sql AS $$
  SELECT pg_stat_get_xact_numscans('idempotency.idempotency_keys_pkey'::regclass)
$$;
GRANT EXECUTE ON FUNCTION cf.scans() TO PUBLIC;
CREATE FUNCTION cf.make_role(who name) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('CREATE ROLE %I', who);
  EXECUTE format('GRANT USAGE ON SCHEMA idempotency TO %I', who);
END $$;
CREATE FUNCTION cf.drop_role(who name) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('REVOKE USAGE ON SCHEMA idempotency FROM %I', who);
  EXECUTE format('DROP ROLE %I', who);
END $$;
SELECT cf.make_role('cf_claimer');
SELECT cf.make_role('cf_other');
SELECT cf.make_role('cf_reused');
SELECT cf.make_role('cf_renamed');

-- One case, in one transaction, on the path of `prefix` ('d' direct, 'e' the executor): a
-- claim of PREFIX-KEY as `claimer` with `ttl` (and the same lease), then, as `completer`, the
-- completion of PREFIX-TARGET in `scope` with the claim's token. Returns the completion's
-- status ('replay': the stored outcome, as complete_key answers) or SQLSTATE, and whether it
-- scanned the primary key.
--   `expire`: wait (on the clock, not a sleep) until the claim has expired first;
--   `reuse`: the claimer's name goes to a new role before the completion (the row's stamp then
--   names the earlier role's OID), and the completer is that new role;
--   `rename`: the claimer is renamed before the completion and completes under its new name
--   (the stamp is its OID, the row's owner its former name).
CREATE FUNCTION cf.run(prefix text, claimer name, completer name, k text, target text,
                       scope text DEFAULT '', ttl interval DEFAULT '1 hour',
                       expire boolean DEFAULT false, reuse boolean DEFAULT false,
                       rename boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  t uuid;
  expires timestamptz;
  before bigint;
  answer text;
BEGIN
  PERFORM set_config('idempotency.executor_path', CASE prefix WHEN 'e' THEN 'on' ELSE 'off' END, true);
  EXECUTE format('SET LOCAL ROLE %I', claimer);
  SELECT token INTO t FROM idempotency.claim_key(prefix || '-' || k, NULL::bytea, ttl => ttl,
                                                 lease => ttl);
  RESET ROLE;
  IF expire THEN
    SELECT expires_at INTO expires FROM idempotency.idempotency_keys WHERE key = prefix || '-' || k;
    WHILE clock_timestamp() <= expires LOOP
    END LOOP;
  END IF;
  IF reuse THEN
    EXECUTE format('ALTER ROLE %I RENAME TO %I', claimer, claimer || '_gone');
    PERFORM cf.make_role(claimer);
    completer := claimer;
  END IF;
  IF rename THEN
    EXECUTE format('ALTER ROLE %I RENAME TO %I', claimer, claimer || '_new');
    completer := claimer || '_new';
  END IF;
  EXECUTE format('SET LOCAL ROLE %I', completer);
  before := cf.scans();
  BEGIN
    SELECT status::text INTO answer
      FROM idempotency.complete_key(prefix || '-' || target, t, '{"done": true}'::jsonb, 200,
                                    scope => scope);
  EXCEPTION WHEN OTHERS THEN
    answer := SQLSTATE;
  END;
  answer := answer || CASE WHEN cf.scans() > before THEN ' scanned' ELSE ' by address' END;
  RESET ROLE;
  IF reuse THEN
    PERFORM cf.drop_role(claimer);
    EXECUTE format('ALTER ROLE %I RENAME TO %I', claimer || '_gone', claimer);
  END IF;
  IF rename THEN
    EXECUTE format('ALTER ROLE %I RENAME TO %I', claimer || '_new', claimer);
  END IF;
  RETURN answer;
END $$;

-- Both paths of one case: 'direct answer / executor answer'.
CREATE FUNCTION cf.both(k text, claimer name, completer name, target text,
                        scope text DEFAULT '', ttl interval DEFAULT '1 hour',
                        expire boolean DEFAULT false, reuse boolean DEFAULT false,
                        rename boolean DEFAULT false)
RETURNS text LANGUAGE sql AS $$
  SELECT cf.run('d', claimer, completer, k, target, scope, ttl, expire, reuse, rename) || ' / ' ||
         cf.run('e', claimer, completer, k, target, scope, ttl, expire, reuse, rename)
$$;

-- The holder itself: accepted on both, and on the direct path by the direct check.
SELECT is(cf.both('own', 'cf_claimer', 'cf_claimer', 'own'),
          'replay by address / replay scanned',
          'the holder completes its own claim: the direct check accepts, by the row''s address');
SELECT is((SELECT status::text FROM idempotency.idempotency_keys WHERE key = 'd-own'), 'completed',
          'and the direct completion is stored');

-- Another key with the holder's token: the key differs.
SELECT is(cf.both('key', 'cf_claimer', 'cf_claimer', 'key-other'),
          'P0002 scanned / P0002 scanned', 'the token of another key: P0002 on both paths');
SELECT is((SELECT status::text FROM idempotency.idempotency_keys WHERE key = 'd-key'), 'processing',
          'and the claim is unchanged');

-- The same key in another scope: the scope differs.
SELECT is(cf.both('scope', 'cf_claimer', 'cf_claimer', 'scope', scope => 'elsewhere'),
          'P0002 scanned / P0002 scanned', 'the same key in another scope: P0002 on both paths');

-- Another role with the holder's token: the owner's name differs.
SELECT is(cf.both('role', 'cf_claimer', 'cf_other', 'role'),
          'P0002 scanned / P0002 scanned', 'another role with the holder''s token: P0002 on both paths');
SELECT is((SELECT status::text FROM idempotency.idempotency_keys WHERE key = 'd-role'), 'processing',
          'and the claim is unchanged');

-- A claim that expired before its completion: expires_at is not after now. The look at the
-- row is in the claim's transaction: once committed, the expired claim is the cleanup
-- worker's to delete, at any moment.
BEGIN;
SELECT is(cf.both('expired', 'cf_claimer', 'cf_claimer', 'expired', ttl => '2 ms', expire => true),
          'P0002 scanned / P0002 scanned', 'a claim expired before its completion: P0002 on both paths');
SELECT is((SELECT status::text FROM idempotency.idempotency_keys WHERE key = 'd-expired'), 'processing',
          'and the claim is unchanged');
COMMIT;

-- A new role under the holder's name: the name matches, the stamp names the earlier role.
SELECT is(cf.both('reused', 'cf_reused', 'cf_reused', 'reused', reuse => true),
          'P0002 scanned / P0002 scanned',
          'a new role under the holder''s name, with its token: P0002 on both paths');
SELECT is((SELECT status::text FROM idempotency.idempotency_keys WHERE key = 'd-reused'), 'processing',
          'and the claim is unchanged');

-- The holder renamed since its claim, under its new name: the stamp matches, the name does
-- not (a key is its owner's name; the fence checks both on both paths).
SELECT is(cf.both('renamed', 'cf_renamed', 'cf_renamed', 'renamed', rename => true),
          'P0002 scanned / P0002 scanned',
          'the holder renamed since its claim, with its token: P0002 on both paths');
SELECT is((SELECT status::text FROM idempotency.idempotency_keys WHERE key = 'd-renamed'),
          'processing', 'and the claim is unchanged');

-- A claim that has not expired yet, however short: still accepted by the direct check.
SELECT is(cf.both('short', 'cf_claimer', 'cf_claimer', 'short', ttl => '1 min'),
          'replay by address / replay scanned', 'a live short claim: accepted by both');

-- Every direct case above that completed was done by the direct check.
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys
            WHERE key LIKE 'd-%' AND status = 'completed'), 2,
          'two direct completions (own, short), the rest refused');

SELECT cf.drop_role('cf_claimer');
SELECT cf.drop_role('cf_other');
SELECT cf.drop_role('cf_reused');
SELECT cf.drop_role('cf_renamed');
SELECT * FROM finish();
