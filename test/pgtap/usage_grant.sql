-- pgTAP: only roles with USAGE on the extension's schema call its functions, however the call
-- is reached (SPEC §7, issue #32 item 3). A call bound by OID (a BEGIN ATOMIC body, a view, a
-- kept plan) passes no name look-up, so each function that touches keys checks USAGE itself,
-- for current_user, at every call: claim_key, complete_key, release_key, checkpoint_key,
-- claim_keys, complete_keys and idempotency_cleanup refuse with 42501 and change nothing, in
-- FROM (the extension's scan) and in a select list alike. The verdict a backend keeps is
-- forgotten when the grant goes, directly or with a membership. The pure helpers
-- (gen_uuid_v7, request_fingerprint, uuid_v7_time) and the statistics of
-- idempotency_monitor.idempotency_stats stay callable (SECURITY.md, least privilege).
--
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed. Roles are
-- cluster-wide: they carry the prefix ug_ and are dropped at the end.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(41);

-- The SQLSTATE of `query` run as `role`, or 'ok'.
CREATE FUNCTION state_as(role text, query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  outcome text := 'ok';
BEGIN
  BEGIN
    PERFORM set_config('role', role, true);
    EXECUTE query;
    PERFORM set_config('role', 'none', true);
  EXCEPTION WHEN OTHERS THEN
    outcome := SQLSTATE;  -- the role set above is undone with the block
  END;
  RETURN outcome;
END
$$;

-- The keys whose name starts with `prefix`, with what a refused call must leave as it was.
CREATE FUNCTION keys_like(prefix text) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce(string_agg(concat_ws(' ', key, status, recovery_point, attempts,
                                       locked_until IS NOT NULL), ', ' ORDER BY key), 'none')
    FROM idempotency.idempotency_keys WHERE starts_with(key, prefix)
$$;

CREATE ROLE ug_maker;     -- granted: makes the functions and views the others call
CREATE ROLE ug_stranger;  -- never granted anything on the schema
CREATE ROLE ug_direct;    -- granted, then revoked
CREATE ROLE ug_group;     -- holds the grant ...
CREATE ROLE ug_member IN ROLE ug_group;  -- ... for its member, until the membership goes
CREATE ROLE ug_monitor IN ROLE pg_monitor;
GRANT USAGE ON SCHEMA idempotency TO ug_maker, ug_direct, ug_group;
GRANT EXECUTE ON FUNCTION idempotency.idempotency_cleanup(integer)
  TO ug_maker, ug_stranger, ug_member;
CREATE SCHEMA app AUTHORIZATION ug_maker;
GRANT USAGE ON SCHEMA app TO PUBLIC;

SET ROLE ug_maker;
-- Bound by OID when created: no later call looks a name up.
CREATE FUNCTION app.claim(k text) RETURNS text LANGUAGE sql
BEGIN ATOMIC SELECT status::text FROM idempotency.claim_key(k); END;
CREATE FUNCTION app.claim_in_list(k text) RETURNS text LANGUAGE sql
BEGIN ATOMIC SELECT (idempotency.claim_key(k)).status::text; END;
CREATE FUNCTION app.complete(k text, t uuid) RETURNS text LANGUAGE sql
BEGIN ATOMIC SELECT status::text FROM idempotency.complete_key(k, t, '{"ok": true}'); END;
CREATE FUNCTION app.release(k text, t uuid) RETURNS void LANGUAGE sql
BEGIN ATOMIC SELECT idempotency.release_key(k, t); END;
CREATE FUNCTION app.checkpoint(k text, t uuid) RETURNS timestamptz LANGUAGE sql
BEGIN ATOMIC SELECT idempotency.checkpoint_key(k, t, 'step 2'); END;
CREATE FUNCTION app.claim_many(ks text[]) RETURNS bigint LANGUAGE sql
BEGIN ATOMIC SELECT count(*) FROM idempotency.claim_keys(ks); END;
CREATE FUNCTION app.complete_one(k text, t uuid) RETURNS bigint LANGUAGE sql
BEGIN ATOMIC SELECT count(*) FROM idempotency.complete_keys(ARRAY[k], ARRAY[t], ARRAY['{}'::jsonb]); END;
CREATE FUNCTION app.cleanup() RETURNS bigint LANGUAGE sql
BEGIN ATOMIC SELECT idempotency.idempotency_cleanup(); END;
CREATE FUNCTION app.claim_as_maker(k text) RETURNS text LANGUAGE sql SECURITY DEFINER
BEGIN ATOMIC SELECT status::text FROM idempotency.claim_key(k); END;
CREATE FUNCTION app.helpers() RETURNS boolean LANGUAGE sql
BEGIN ATOMIC
  SELECT idempotency.uuid_v7_time(idempotency.gen_uuid_v7()) IS NOT NULL
     AND length(idempotency.request_fingerprint('{"a": 1}'::jsonb)) > 0;
END;
CREATE VIEW app.claimed AS SELECT status::text AS status FROM idempotency.claim_key('view-key');
CREATE VIEW app.claimed_in_list AS SELECT (idempotency.claim_key('view-list-key')).status::text AS status;
GRANT SELECT ON app.claimed, app.claimed_in_list TO PUBLIC;
RESET ROLE;

-- The granted role itself, and the way around that is meant to work: a SECURITY DEFINER
-- function calls as its owner, whose USAGE counts (its keys are the owner's).
SELECT is(state_as('ug_maker', $$SELECT app.claim('maker-1')$$), 'ok', 'the granted role claims');
SELECT is(state_as('ug_stranger', $$SELECT app.claim_as_maker('maker-2')$$), 'ok',
          'SECURITY DEFINER of a granted owner: the owner claims for the ungranted caller');
SELECT is(keys_like('maker-'), 'maker-1 processing 1 t, maker-2 processing 1 t',
          'both keys stored');

-- A role never granted anything, through a BEGIN ATOMIC body: every function that touches
-- keys refuses, in FROM (our scan), in a select list and on the function scan.
SELECT is(state_as('ug_stranger', $$SELECT app.claim('stranger-1')$$), '42501',
          'no USAGE: claim_key in FROM of a BEGIN ATOMIC body refuses (42501)');
SELECT is(state_as('ug_stranger', $$SELECT app.claim_in_list('stranger-2')$$), '42501',
          'no USAGE: claim_key in a select list refuses');
SET idempotency.result_scan = off;
SELECT is(state_as('ug_stranger', $$SELECT app.claim('stranger-3')$$), '42501',
          'no USAGE: claim_key on the function scan refuses');
RESET idempotency.result_scan;
SELECT is(state_as('ug_stranger', $$SELECT app.complete('stranger-1', gen_random_uuid())$$), '42501',
          'no USAGE: complete_key refuses');
SELECT is(state_as('ug_stranger', $$SELECT app.release('stranger-1', gen_random_uuid())$$), '42501',
          'no USAGE: release_key refuses');
SELECT is(state_as('ug_stranger', $$SELECT app.checkpoint('stranger-1', gen_random_uuid())$$), '42501',
          'no USAGE: checkpoint_key refuses');
SELECT is(state_as('ug_stranger', $$SELECT app.claim_many(ARRAY['stranger-4', 'stranger-5'])$$), '42501',
          'no USAGE: claim_keys refuses');
SELECT is(state_as('ug_stranger', $$SELECT app.complete_one('stranger-1', gen_random_uuid())$$), '42501',
          'no USAGE: complete_keys refuses');
SELECT is(state_as('ug_stranger', $$SELECT app.cleanup()$$), '42501',
          'no USAGE (EXECUTE granted): idempotency_cleanup refuses');
-- A view made by the granted role (in FROM: the extension's scan, which calls the function
-- itself, so the same check refuses).
CREATE FUNCTION plan_of(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  line text;
  lines text := '';
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP lines := lines || line || ' '; END LOOP;
  RETURN lines;
END
$$;
-- C++ edition only, from here (the portable edition has no result scan: its view runs the function scan)
SELECT matches(plan_of('SELECT * FROM app.claimed'), 'Custom Scan \(idempotency function\)',
               'the view''s claim runs on the extension''s scan');
-- C++ edition only, to here
SELECT is(state_as('ug_stranger', $$SELECT * FROM app.claimed$$), '42501',
          'no USAGE: a view calling claim_key in FROM refuses');
SELECT is(state_as('ug_stranger', $$SELECT * FROM app.claimed_in_list$$), '42501',
          'no USAGE: a view calling claim_key in its select list refuses');
SELECT is(keys_like('stranger-') || ' / ' || keys_like('view-'), 'none / none',
          'and nothing was stored');
-- The message says what to grant.
SET ROLE ug_stranger;
SELECT throws_ok($$SELECT app.claim('stranger-6')$$, '42501',
                 'permission denied for schema idempotency', 'the refusal names the schema');
RESET ROLE;

-- Helpers that touch no key stay callable (they compute from their arguments alone, like
-- core's gen_random_uuid and digest), and so do the statistics for pg_monitor's members,
-- which read them through idempotency_monitor without USAGE on idempotency.
SELECT is(state_as('ug_stranger', $$SELECT app.helpers()$$), 'ok',
          'no USAGE: gen_uuid_v7, request_fingerprint and uuid_v7_time still answer');
-- C++ edition only, from here (shared-memory statistics; the portable edition has idempotency_monitor.key_counts)
SELECT is(state_as('ug_monitor', $$SELECT count(*) FROM idempotency_monitor.idempotency_stats$$), 'ok',
          'a member of pg_monitor reads the statistics without USAGE on idempotency');
-- C++ edition only, to here

-- USAGE through a membership: the member claims, the membership goes, and its next call in
-- this backend (which kept the verdict) refuses, with its own valid token too.
SELECT is(state_as('ug_member', $$SELECT app.claim('member-1')$$), 'ok',
          'USAGE through ug_group: the member claims');
SELECT lease_token AS member_token FROM idempotency.idempotency_keys WHERE key = 'member-1' \gset
SELECT keys_like('member-') AS member_before \gset
-- A membership change invalidates no kept plan (unlike REVOKE USAGE, below): only the
-- function's own check stands between the plan and the key table. (Nothing reads the key
-- table between PREPARE and the last EXECUTE: that can invalidate the plan, which is then
-- parsed again and refused by the name look-up.)
SET ROLE ug_member;
SET plan_cache_mode = force_generic_plan;
PREPARE member_claim(text) AS SELECT status::text FROM idempotency.claim_key($1);
SELECT lives_ok($$EXECUTE member_claim('member-kept-1')$$, 'a kept plan of the member claims');
RESET ROLE;
REVOKE ug_group FROM ug_member;
SET ROLE ug_member;
SELECT throws_ok($$EXECUTE member_claim('member-kept-2')$$, '42501', NULL,
                 'membership revoked: the kept plan made under it refuses');
RESET ROLE;
RESET plan_cache_mode;
DEALLOCATE member_claim;
SELECT is(state_as('ug_member', format($$SELECT app.complete('member-1', %L)$$, :'member_token')),
          '42501', 'membership revoked: completing its own claim refuses');
SELECT is(state_as('ug_member', format($$SELECT app.release('member-1', %L)$$, :'member_token')),
          '42501', 'membership revoked: releasing it refuses');
SELECT is(state_as('ug_member', format($$SELECT app.checkpoint('member-1', %L)$$, :'member_token')),
          '42501', 'membership revoked: a checkpoint refuses');
SELECT is(state_as('ug_member', format($$SELECT app.complete_one('member-1', %L)$$, :'member_token')),
          '42501', 'membership revoked: complete_keys refuses');
SELECT is(state_as('ug_member', $$SELECT app.claim('member-2')$$), '42501',
          'membership revoked: a new claim refuses');
SELECT is(state_as('ug_member', $$SELECT app.claim_many(ARRAY['member-3'])$$), '42501',
          'membership revoked: claim_keys refuses');
SELECT is(state_as('ug_member', $$SELECT app.cleanup()$$), '42501',
          'membership revoked: idempotency_cleanup refuses');
SELECT is(keys_like('member-'), :'member_before' || ', member-kept-1 processing 1 t',
          'the claims are as they were, and nothing new');
GRANT ug_group TO ug_member;
SELECT is(state_as('ug_member', format($$SELECT app.complete('member-1', %L)$$, :'member_token')),
          'ok', 'membership back: the member completes its claim');

-- A kept plan made while the grant held: after REVOKE USAGE its next execution refuses
-- (PostgreSQL plans it again after the schema's change, and the name look-up refuses too).
SET ROLE ug_direct;
SET plan_cache_mode = force_generic_plan;
PREPARE direct_claim(text) AS SELECT status::text FROM idempotency.claim_key($1);
PREPARE direct_claim_in_list(text) AS SELECT (idempotency.claim_key($1)).status::text;
PREPARE direct_claims(text[]) AS SELECT count(*) FROM idempotency.claim_keys($1);
SELECT lives_ok($$EXECUTE direct_claim('direct-1')$$, 'a kept plan claims while the grant holds');
SELECT lives_ok($$EXECUTE direct_claim_in_list('direct-2')$$, 'the select-list form too');
RESET ROLE;
REVOKE USAGE ON SCHEMA idempotency FROM ug_direct;
SET ROLE ug_direct;
SELECT throws_ok($$EXECUTE direct_claim('direct-3')$$, '42501', NULL,
                 'REVOKE USAGE: the kept plan of claim_key in FROM refuses');
SELECT throws_ok($$EXECUTE direct_claim_in_list('direct-4')$$, '42501', NULL,
                 'REVOKE USAGE: the kept plan of a select-list call refuses');
SELECT throws_ok($$EXECUTE direct_claims(ARRAY['direct-5'])$$, '42501', NULL,
                 'REVOKE USAGE: the kept plan of claim_keys refuses');
RESET ROLE;
RESET plan_cache_mode;
SELECT is(keys_like('direct-'), 'direct-1 processing 1 t, direct-2 processing 1 t',
          'only the claims made under the grant are stored');
GRANT USAGE ON SCHEMA idempotency TO ug_direct;
SET ROLE ug_direct;
SELECT lives_ok($$EXECUTE direct_claim('direct-6')$$, 'granted again: the kept plan claims again');
RESET ROLE;
DEALLOCATE direct_claim;
DEALLOCATE direct_claim_in_list;
DEALLOCATE direct_claims;

-- SET ROLE within one session: the verdict is per role, not per backend.
SELECT is(state_as('ug_maker', $$SELECT app.claim('switch-1')$$) || ' '
          || state_as('ug_stranger', $$SELECT app.claim('switch-2')$$) || ' '
          || state_as('ug_maker', $$SELECT app.claim('switch-3')$$),
          'ok 42501 ok', 'granted, ungranted, granted in turn: each call judged for its role');
SELECT is(keys_like('switch-'), 'switch-1 processing 1 t, switch-3 processing 1 t',
          'only the granted role''s keys');

-- A superuser needs no grant.
SELECT is(state_as('postgres', $$SELECT app.claim('super-1')$$), 'ok', 'a superuser claims');

DELETE FROM idempotency.idempotency_keys;
DROP OWNED BY ug_maker, ug_stranger, ug_direct, ug_member, ug_group, ug_monitor;
DROP ROLE ug_maker, ug_stranger, ug_direct, ug_member, ug_group, ug_monitor;

SELECT * FROM finish();
