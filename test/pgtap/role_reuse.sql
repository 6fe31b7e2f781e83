-- pgTAP: a key belongs to the role that claimed it, not to its name (issue #32, item 1). A role
-- created under the name of a dropped role (in the same transaction as the DROP, or in
-- another), or renamed to the name of another, never reads, waits on, completes, releases or
-- checkpoints a key of the earlier role: its claim answers `claimed` (attempts 1, no stored
-- response, no recovery point) and its fenced calls with the earlier role's very tokens get
-- P0002, changing nothing. No cleanup runs in between: idempotency.cleanup_worker is off for
-- this database, so the earlier role's keys are still in the table when the newcomer calls.
-- Roles are cluster-wide: they carry the prefix rr_ and are dropped at the end.
-- On every path: the direct path and the executor's statements (test/paths/executor.*).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(30);

SELECT format('ALTER DATABASE %I SET idempotency.cleanup_worker = off', current_database()) \gexec

CREATE SCHEMA rr;
-- Runs `sql` as `who` and returns its first column as text, or "SQLSTATE: message" when it
-- raises.
CREATE FUNCTION rr.as_role(who name, sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  result text;
  state text;
  message text;
BEGIN
  EXECUTE format('SET ROLE %I', who);
  BEGIN
    EXECUTE sql INTO result;
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    result := state || ': ' || message;
  END;
  RESET ROLE;
  RETURN result;
END $$;
-- The stored row of (owner, '', key), as the superuser sees it, in one comparable string.
CREATE FUNCTION rr.row_of(who text, k text) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce((SELECT format('%s attempts=%s token=%s rp=%s code=%s response=%s oid=%s',
                                 status, attempts, lease_token, coalesce(recovery_point, '-'),
                                 coalesce(response_code::text, '-'), coalesce(response::text, '-'),
                                 owner_oid)
                     FROM idempotency.idempotency_keys
                    WHERE owner = who AND scope = '' AND key = k), 'absent') $$;
CREATE FUNCTION rr.make_role(who name) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('CREATE ROLE %I', who);
  EXECUTE format('GRANT USAGE ON SCHEMA idempotency TO %I', who);
END $$;
CREATE FUNCTION rr.drop_role(who name) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('REVOKE USAGE ON SCHEMA idempotency FROM %I', who);
  EXECUTE format('DROP ROLE %I', who);
END $$;
-- The earlier role's keys: a completed one, an open claim (lease of an hour), an open claim with a
-- recovery point, and one for release; their tokens are kept in rr.tokens.
CREATE TABLE rr.tokens (who text, k text, token uuid);
CREATE FUNCTION rr.old_keys(who name) RETURNS void LANGUAGE plpgsql AS $$
DECLARE t uuid;
BEGIN
  EXECUTE format('SET ROLE %I', who);
  SELECT token INTO t FROM idempotency.claim_key('order-1', NULL::bytea);
  PERFORM idempotency.complete_key('order-1', t, '{"paid": "old"}'::jsonb, 201);
  SELECT token INTO t FROM idempotency.claim_key('open-1', NULL::bytea, lease => '1 hour');
  RESET ROLE;
  INSERT INTO rr.tokens VALUES (who, 'open-1', t);
  EXECUTE format('SET ROLE %I', who);
  SELECT token INTO t FROM idempotency.claim_key('ckpt-1', NULL::bytea, lease => '1 hour');
  PERFORM idempotency.checkpoint_key('ckpt-1', t, 'step 3 of the old role');
  RESET ROLE;
  INSERT INTO rr.tokens VALUES (who, 'ckpt-1', t);
  EXECUTE format('SET ROLE %I', who);
  SELECT token INTO t FROM idempotency.claim_key('rel-1', NULL::bytea, lease => '1 hour');
  RESET ROLE;
  INSERT INTO rr.tokens VALUES (who, 'rel-1', t);
END $$;
CREATE FUNCTION rr.token(who text, k text) RETURNS text LANGUAGE sql AS
  $$ SELECT token::text FROM rr.tokens WHERE tokens.who = $1 AND tokens.k = $2 $$;

SELECT rr.make_role('rr_alice');
SELECT rr.make_role('rr_bob');
SELECT rr.old_keys('rr_alice');

-------------------------------------------------------------------------------
-- 1. DROP ROLE and CREATE ROLE in two transactions, no cleanup in between.
-------------------------------------------------------------------------------
SELECT rr.row_of('rr_alice', 'ckpt-1') AS ckpt_before \gset
SELECT rr.row_of('rr_alice', 'rel-1') AS rel_before \gset
SELECT rr.drop_role('rr_alice');
SELECT rr.make_role('rr_alice');

-- Fenced calls first, with the earlier role's tokens: each refused as missing, nothing changed.
SELECT is(rr.as_role('rr_alice', format(
  $$SELECT status FROM idempotency.complete_key('ckpt-1', %L, '{"paid": "new"}'::jsonb, 200)$$,
  rr.token('rr_alice', 'ckpt-1'))),
  'P0002: idempotency key "ckpt-1" does not exist or has expired',
  'two transactions: the newcomer cannot complete the earlier role''s claim with its token');
SELECT is(rr.as_role('rr_alice', format(
  $$SELECT idempotency.checkpoint_key('ckpt-1', %L, 'hijacked')::text$$,
  rr.token('rr_alice', 'ckpt-1'))),
  'P0002: idempotency key "ckpt-1" does not exist or has expired',
  'two transactions: nor checkpoint it');
SELECT is(rr.as_role('rr_alice', format(
  $$SELECT idempotency.release_key('rel-1', %L)::text$$, rr.token('rr_alice', 'rel-1'))),
  'P0002: idempotency key "rel-1" does not exist or has expired',
  'two transactions: nor release one');
SELECT is(rr.row_of('rr_alice', 'ckpt-1'), :'ckpt_before',
  'the earlier role''s claim with a recovery point is unchanged');
SELECT is(rr.row_of('rr_alice', 'rel-1'), :'rel_before', 'and its claim to release too');
-- Claims: a fresh claim each, never the stored answer or the earlier role's lease.
SELECT is(rr.as_role('rr_alice', $$SELECT format('%s attempts=%s response=%s rp=%s', status, attempts,
  coalesce(response::text, '-'), coalesce(recovery_point, '-'))
  FROM idempotency.claim_key('order-1', NULL::bytea)$$),
  'claimed attempts=1 response=- rp=-',
  'two transactions: the newcomer''s claim of a completed key of the earlier role is claimed, not a replay');
SELECT is(rr.as_role('rr_alice', $$SELECT status::text FROM idempotency.claim_key('open-1', NULL::bytea)$$),
  'claimed', 'an open claim of the earlier role does not answer in_progress');
SELECT is(rr.as_role('rr_alice', $$SELECT format('%s attempts=%s rp=%s', status, attempts,
  coalesce(recovery_point, '-')) FROM idempotency.claim_key('ckpt-1', NULL::bytea)$$),
  'claimed attempts=1 rp=-', 'nor does its recovery point reach the newcomer');
SELECT is(rr.as_role('rr_alice', $$SELECT string_agg(status::text, ',') FROM idempotency.claim_keys(ARRAY['rel-1'])$$),
  'claimed', 'a batch claim of the newcomer is claimed too');
SELECT is((SELECT owner_oid FROM idempotency.idempotency_keys WHERE owner = 'rr_alice' AND key = 'order-1'),
  (SELECT oid FROM pg_roles WHERE rolname = 'rr_alice'),
  'the row taken over carries the newcomer''s OID');
SELECT is((SELECT owner_system FROM idempotency.idempotency_keys WHERE owner = 'rr_alice' AND key = 'order-1'),
  (SELECT system_identifier FROM pg_control_system()), 'and this cluster''s system identifier');
-- The newcomer's own keys work as any role's: its claim then completes and replays.
SELECT lease_token AS new_token FROM idempotency.idempotency_keys
 WHERE owner = 'rr_alice' AND key = 'order-1' \gset
SELECT is(rr.as_role('rr_alice', format($$SELECT status::text FROM idempotency.complete_key('order-1',
  %L, '{"paid": "new"}'::jsonb, 200)$$, :'new_token')), 'replay',
  'the newcomer completes its own claim (complete_key answers with the stored row: replay)');
SELECT is(rr.as_role('rr_alice', $$SELECT response::text FROM idempotency.claim_key('order-1', NULL::bytea)$$),
  '{"paid": "new"}', 'and replays its own response');
-- The earlier role's tokens still fail on the keys the newcomer now holds.
SELECT matches(rr.as_role('rr_alice', format(
  $$SELECT idempotency.release_key('open-1', %L)::text$$, rr.token('rr_alice', 'open-1'))),
  '^55000: token does not hold idempotency key "open-1"',
  'the earlier role''s token does not hold the key the newcomer claimed (55000)');

-------------------------------------------------------------------------------
-- 2. DROP ROLE and CREATE ROLE in one transaction, with the newcomer's claims in it.
-------------------------------------------------------------------------------
SELECT rr.make_role('rr_carol');
SELECT rr.old_keys('rr_carol');
SELECT rr.row_of('rr_carol', 'ckpt-1') AS ckpt_before \gset
CREATE FUNCTION rr.reuse_in_one_transaction() RETURNS text LANGUAGE plpgsql AS $$
DECLARE answers text;
BEGIN
  PERFORM rr.drop_role('rr_carol');
  PERFORM rr.make_role('rr_carol');
  answers := concat_ws(' ',
    rr.as_role('rr_carol', format(
      $q$SELECT status FROM idempotency.complete_key('ckpt-1', %L, '{"paid": "new"}'::jsonb, 200)$q$,
      rr.token('rr_carol', 'ckpt-1'))),
    rr.as_role('rr_carol', $q$SELECT status::text FROM idempotency.claim_key('order-1', NULL::bytea)$q$),
    rr.as_role('rr_carol', $q$SELECT status::text FROM idempotency.claim_key('open-1', NULL::bytea)$q$));
  RETURN answers;
END $$;
SELECT is(rr.reuse_in_one_transaction(),
  'P0002: idempotency key "ckpt-1" does not exist or has expired claimed claimed',
  'one transaction: the newcomer''s completion is refused and its claims are claimed');
SELECT is(rr.row_of('rr_carol', 'ckpt-1'), :'ckpt_before',
  'one transaction: the earlier role''s claim is unchanged');

-------------------------------------------------------------------------------
-- 3. A rename swap: rr_alice and rr_bob exchange names. Each name's keys stay with the role
--    that made them, which no longer has that name: neither role reads the other's.
-------------------------------------------------------------------------------
SELECT rr.make_role('rr_dave');
SELECT rr.make_role('rr_erin');
SELECT rr.as_role('rr_dave', $$SELECT status::text FROM idempotency.complete_key('swap-1',
  (SELECT token FROM idempotency.claim_key('swap-1', NULL::bytea)), '{"by": "dave"}'::jsonb, 200)$$);
SELECT rr.as_role('rr_erin', $$SELECT status::text FROM idempotency.complete_key('swap-1',
  (SELECT token FROM idempotency.claim_key('swap-1', NULL::bytea)), '{"by": "erin"}'::jsonb, 200)$$);
SELECT rr.as_role('rr_dave', $$SELECT status::text FROM idempotency.claim_key('swap-open', NULL::bytea, lease => '1 hour')$$);
SELECT is(rr.as_role('rr_dave', $$SELECT response::text FROM idempotency.claim_key('swap-1', NULL::bytea)$$),
  '{"by": "dave"}', 'before the swap, rr_dave replays its own response');
ALTER ROLE rr_dave RENAME TO rr_swap;
ALTER ROLE rr_erin RENAME TO rr_dave;
ALTER ROLE rr_swap RENAME TO rr_erin;
SELECT is(rr.as_role('rr_dave', $$SELECT status::text FROM idempotency.claim_key('swap-open', NULL::bytea)$$),
  'claimed', 'after the swap, the role now named rr_dave does not get in_progress from the other''s open claim');
SELECT is(rr.as_role('rr_dave', $$SELECT format('%s %s', status, coalesce(response::text, '-'))
  FROM idempotency.claim_key('swap-1', NULL::bytea)$$),
  'claimed -', 'nor the other''s response: claimed');
SELECT is(rr.as_role('rr_erin', $$SELECT format('%s %s', status, coalesce(response::text, '-'))
  FROM idempotency.claim_key('swap-1', NULL::bytea)$$),
  'claimed -', 'and the role now named rr_erin does not get its former partner''s response either');

-------------------------------------------------------------------------------
-- 4. The stamp of every write, on both paths: a new key and a completion carry the caller's
--    OID and this cluster's system identifier; a row without a stamp (1.2, or restored from
--    another cluster) is adopted by name, and the first write stamps it.
-------------------------------------------------------------------------------
SELECT rr.as_role('rr_bob', $$SELECT status::text FROM idempotency.claim_key('stamp-1', NULL::bytea)$$);
SELECT is((SELECT format('%s %s', owner_oid = 'rr_bob'::regrole,
                         owner_system = (SELECT system_identifier FROM pg_control_system()))
             FROM idempotency.idempotency_keys WHERE owner = 'rr_bob' AND key = 'stamp-1'),
  't t', 'a new claim is stamped with its role and cluster');
UPDATE idempotency.idempotency_keys SET owner_oid = NULL, owner_system = NULL
 WHERE owner = 'rr_bob' AND key = 'stamp-1';
SELECT is(rr.as_role('rr_bob', $$SELECT status::text FROM idempotency.claim_key('stamp-1', NULL::bytea)$$),
  'in_progress', 'an unstamped row is adopted by name: its open claim answers in_progress');
UPDATE idempotency.idempotency_keys SET owner_oid = 4242, owner_system = 12345
 WHERE owner = 'rr_bob' AND key = 'stamp-1';
SELECT is(rr.as_role('rr_bob', $$SELECT status::text FROM idempotency.claim_key('stamp-1', NULL::bytea)$$),
  'in_progress', 'a row stamped in another cluster is adopted by name too');
SELECT lease_token AS stamp_token FROM idempotency.idempotency_keys
 WHERE owner = 'rr_bob' AND key = 'stamp-1' \gset
SELECT is(rr.as_role('rr_bob', format($$SELECT status::text FROM idempotency.complete_key('stamp-1',
  %L, '{}'::jsonb, 200)$$, :'stamp_token')), 'replay', 'the adopting role completes it');
SELECT is((SELECT format('%s %s', owner_oid = 'rr_bob'::regrole,
                         owner_system = (SELECT system_identifier FROM pg_control_system()))
             FROM idempotency.idempotency_keys WHERE owner = 'rr_bob' AND key = 'stamp-1'),
  't t', 'and the completion stamps it with its role and this cluster');
UPDATE idempotency.idempotency_keys SET owner_oid = 4242
 WHERE owner = 'rr_bob' AND key = 'stamp-1';
SELECT is(rr.as_role('rr_bob', $$SELECT status::text FROM idempotency.claim_key('stamp-1', NULL::bytea)$$),
  'claimed', 'a row stamped here with another OID is no replay for the role of its name');

-------------------------------------------------------------------------------
-- 5. The cleanup deletes the rows no role owns (stamped here by a role that is gone or has
--    another name), adopts the unstamped ones whose name names a role, and keeps the rest.
-------------------------------------------------------------------------------
SELECT rr.as_role('rr_bob', $$SELECT status::text FROM idempotency.claim_key('keep-1', NULL::bytea)$$);
SELECT rr.as_role('rr_bob', $$SELECT status::text FROM idempotency.claim_key('adopt-1', NULL::bytea)$$);
SELECT rr.as_role('rr_bob', $$SELECT status::text FROM idempotency.claim_key('gone-1', NULL::bytea)$$);
UPDATE idempotency.idempotency_keys SET owner_oid = NULL, owner_system = NULL
 WHERE owner = 'rr_bob' AND key = 'adopt-1';
UPDATE idempotency.idempotency_keys SET owner_oid = 4242
 WHERE owner = 'rr_bob' AND key = 'gone-1';
SELECT rr.as_role('rr_alice', $$SELECT status::text FROM idempotency.claim_key('renamed-1', NULL::bytea)$$);
ALTER ROLE rr_alice RENAME TO rr_alice2;
ALTER ROLE rr_alice2 RENAME TO rr_alice;
SELECT idempotency.idempotency_cleanup() >= 1 AS cleaned \gset
SELECT is((SELECT string_agg(key, ',' ORDER BY key) FROM idempotency.idempotency_keys
            WHERE owner = 'rr_bob' AND key IN ('keep-1', 'adopt-1', 'gone-1')),
  'adopt-1,keep-1', 'the cleanup deletes a row stamped by a role that is gone, and keeps the rest');
SELECT is((SELECT owner_oid = 'rr_bob'::regrole FROM idempotency.idempotency_keys
            WHERE owner = 'rr_bob' AND key = 'adopt-1'),
  true, 'it stamps an unstamped row with the OID of the role of its name');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys WHERE owner = 'rr_alice' AND key = 'renamed-1'),
  1, 'a role renamed and renamed back keeps its keys (same OID, same name)');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys k
            WHERE NOT EXISTS (SELECT FROM pg_authid a WHERE a.rolname = k.owner AND a.oid = k.owner_oid)),
  0, 'after the cleanup, every row names its role by name and OID');

-------------------------------------------------------------------------------
SELECT * FROM finish();
DELETE FROM idempotency.idempotency_keys WHERE owner LIKE 'rr\_%';
SELECT rr.drop_role(r) FROM unnest(ARRAY['rr_alice', 'rr_bob', 'rr_carol', 'rr_dave', 'rr_erin']) r;
SELECT format('ALTER DATABASE %I RESET idempotency.cleanup_worker', current_database()) \gexec
