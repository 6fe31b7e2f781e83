-- pgTAP: the key's life cycle of 1.3 (issue #37, SPEC section 3.5): look_key answers what
-- claim_key would answer now without claiming, writing or waiting; forget_key deletes the
-- caller's own completed, released or expired key (a live claim only with its token). Each for
-- the caller's own keys only (another role's key does not exist for it), refused to a role
-- without USAGE on the schema and inside a security-restricted operation. Expiry is awaited by
-- polling the clock until the stored expires_at has passed, never by a sleep of a fixed length.
-- Roles are cluster-wide: they carry the prefix lc_ and are dropped at the end.
-- On every path: the direct path and the executor's statements (test/paths/executor.*).
-- Both editions; the blocks marked "C++ edition only" are about its shared-memory statistics
-- and its refusal inside security-restricted operations (the portable edition has neither:
-- portable/README.md, SECURITY.md).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(63);

SELECT format('ALTER DATABASE %I SET idempotency.cleanup_worker = off', current_database()) \gexec

CREATE SCHEMA lc;
-- Runs `sql` and returns its first column as text, or its SQLSTATE when it raises.
CREATE FUNCTION lc.try(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  result text;
BEGIN
  EXECUTE sql INTO result;
  RETURN coalesce(result, 'NULL');
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE;
END $$;
-- The same as role `who`.
CREATE FUNCTION lc.as_role(who name, sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  result text;
BEGIN
  EXECUTE format('SET ROLE %I', who);
  result := lc.try(sql);
  RESET ROLE;
  RETURN result;
END $$;
-- look_key's answer in one comparable string: status, whether a token came, attempts,
-- response, response_code, whether a fingerprint came, retry_after > 0.
CREATE FUNCTION lc.look(k text, fp bytea DEFAULT NULL) RETURNS text LANGUAGE sql AS $$
  SELECT format('%s token=%s attempts=%s response=%s code=%s fp=%s retry=%s', status,
                (token IS NOT NULL)::text, coalesce(attempts::text, '-'), coalesce(response::text, '-'),
                coalesce(response_code::text, '-'), (fingerprint IS NOT NULL)::text,
                coalesce((retry_after > '0')::text, '-'))
    FROM idempotency.look_key(k, fp) $$;
-- Waits until the stored key of the current role has expired by the clock claim_key reads.
CREATE FUNCTION lc.await_expiry(k text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  until timestamptz;
BEGIN
  SELECT expires_at INTO until FROM idempotency.idempotency_keys
   WHERE owner = current_user AND scope = '' AND key = k;
  WHILE clock_timestamp() <= until LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
  RETURN true;
END $$;
-- The row's version and contents as the superuser sees them: a look must change neither.
CREATE FUNCTION lc.row_of(k text) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce((SELECT format('%s %s %s %s', ctid, xmin, status, attempts)
                     FROM idempotency.idempotency_keys WHERE owner = current_user AND key = k),
                  'absent') $$;

DO $$BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lc_bob') THEN CREATE ROLE lc_bob; END IF;
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'lc_nousage') THEN CREATE ROLE lc_nousage; END IF;
END$$;
GRANT USAGE ON SCHEMA idempotency TO lc_bob;
GRANT USAGE ON SCHEMA lc TO lc_bob, lc_nousage;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA lc TO lc_bob, lc_nousage;
-- C++ edition only, from here (shared-memory statistics)
-- The statistics of this database (NULL without shared memory).
CREATE FUNCTION lc.forgotten() RETURNS bigint LANGUAGE sql AS $$
  SELECT forgotten FROM idempotency.idempotency_stats WHERE datname = current_database() $$;
CREATE TEMP TABLE stats_before AS SELECT coalesce(lc.forgotten(), 0) AS forgotten;
-- C++ edition only, to here

-------------------------------------------------------------------------------
-- look_key
-------------------------------------------------------------------------------
SELECT is(lc.look('l-absent'), 'claimed token=false attempts=- response=- code=- fp=false retry=-',
  'look: an absent key would be claimed (status claimed, no token)');
SELECT is(lc.row_of('l-absent'), 'absent', 'look: writes no row');

CREATE TEMP TABLE t1 AS SELECT * FROM idempotency.claim_key('l-1', '\x01'::bytea, lease => '1 hour');
SELECT is(lc.look('l-1', '\x01'), 'in_progress token=false attempts=1 response=- code=- fp=true retry=true',
  'look: a live claim answers in_progress with retry_after, never its token');
SELECT is(lc.look('l-1', '\x02'), 'mismatch token=false attempts=1 response=- code=- fp=true retry=-',
  'look: another fingerprint answers mismatch');
CREATE TEMP TABLE before_look AS SELECT lc.row_of('l-1') AS r;
SELECT lc.look('l-1');
SELECT is(lc.row_of('l-1'), (SELECT r FROM before_look), 'look: the row keeps its version (no write, no row lock)');
SELECT idempotency.complete_key('l-1', (SELECT token FROM t1), '{"paid": 1}'::jsonb, 201);
SELECT is(lc.look('l-1', '\x01'), 'replay token=false attempts=1 response={"paid": 1} code=201 fp=true retry=-',
  'look: a completed key answers replay with the response');
SELECT is(lc.look('l-1'), 'replay token=false attempts=1 response={"paid": 1} code=201 fp=true retry=-',
  'look: without a fingerprint, replay');
SELECT is(lc.look('l-1', '\x02'), 'mismatch token=false attempts=1 response=- code=- fp=true retry=-',
  'look: a completed key with another fingerprint answers mismatch, no response');
SELECT is((SELECT status::text FROM idempotency.claim_key('l-1', '\x01'::bytea)), 'replay',
  'look: claim_key answers as look_key said');

CREATE TEMP TABLE t2 AS SELECT * FROM idempotency.claim_key('l-rel', NULL::bytea, lease => '1 hour');
SELECT idempotency.checkpoint_key('l-rel', (SELECT token FROM t2), 'step 2');
SELECT idempotency.release_key('l-rel', (SELECT token FROM t2));
SELECT is(lc.look('l-rel'), 'reclaimed token=false attempts=1 response=- code=- fp=false retry=-',
  'look: a released key would be reclaimed (no token; the attempts so far)');
SELECT is((SELECT recovery_point FROM idempotency.look_key('l-rel')), 'step 2',
  'look: reclaimed carries the recovery point');
SELECT is(lc.row_of('l-rel') LIKE '% processing 1', true, 'look: the released key is still unclaimed');

CREATE TEMP TABLE t3 AS SELECT * FROM idempotency.claim_key('l-exp', NULL::bytea, ttl => '200 ms', lease => '1 hour');
SELECT idempotency.complete_key('l-exp', (SELECT token FROM t3), '{"n": 1}'::jsonb);
SELECT lc.await_expiry('l-exp');
SELECT is(lc.look('l-exp'), 'claimed token=false attempts=- response=- code=- fp=false retry=-',
  'look: an expired key would be claimed, and shows nothing of the old row');

-- Errors, as claim_key's.
SELECT is(lc.try($$SELECT idempotency.look_key(NULL)$$), '22004', 'look: NULL key 22004');
SELECT is(lc.try($$SELECT idempotency.look_key('')$$), '22023', 'look: empty key 22023');
SELECT is(lc.try($$SELECT idempotency.look_key(repeat('k', 100000))$$), '22001', 'look: key over the limit 22001');
SELECT is(lc.try($$SELECT idempotency.look_key('k', NULL, NULL)$$), '22004', 'look: NULL scope 22004');

-------------------------------------------------------------------------------
-- forget_key
-------------------------------------------------------------------------------
SELECT is(idempotency.forget_key('f-absent'), false, 'forget: an absent key answers false');
SELECT is(idempotency.forget_key('l-1'), true, 'forget: a completed key is forgotten');
SELECT is(lc.row_of('l-1'), 'absent', 'forget: the row is gone');
SELECT is((SELECT status::text || ' ' || attempts FROM idempotency.claim_key('l-1', '\x01'::bytea)), 'claimed 1',
  'forget: the next claim is claimed (the operation runs again)');
SELECT is(idempotency.forget_key('l-rel'), true, 'forget: a released key is forgotten');
SELECT is(idempotency.forget_key('l-exp'), true, 'forget: an expired key is forgotten');

CREATE TEMP TABLE t4 AS SELECT * FROM idempotency.claim_key('f-live', NULL::bytea, lease => '1 hour');
SELECT is(lc.try($$SELECT idempotency.forget_key('f-live')$$), '55000', 'forget: a live claim without its token 55000');
SELECT is(lc.try($$SELECT idempotency.forget_key('f-live', idempotency.gen_uuid_v7())$$), '55000',
  'forget: a live claim with another token 55000');
SELECT is(lc.row_of('f-live') LIKE '% processing 1', true, 'forget: a refused forget changes nothing');
SELECT is(idempotency.forget_key('f-live', (SELECT token FROM t4)), true, 'forget: a live claim with its token');
SELECT is(lc.try(format($$SELECT idempotency.complete_key('f-live', %L, '{}'::jsonb)$$, (SELECT token FROM t4))),
  'P0002', 'forget: the holder''s later complete gets P0002');

-- A fenced holder: its lease ended and the key was claimed again; its token forgets nothing.
CREATE TEMP TABLE t5 AS SELECT * FROM idempotency.claim_key('f-fenced', NULL::bytea, lease => '1 ms');
DO $$BEGIN
  WHILE clock_timestamp() <= (SELECT locked_until FROM idempotency.idempotency_keys
                               WHERE owner = current_user AND key = 'f-fenced') LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
END$$;
CREATE TEMP TABLE t6 AS SELECT * FROM idempotency.claim_key('f-fenced', NULL::bytea, lease => '1 hour');
SELECT is((SELECT status::text FROM t6), 'reclaimed', 'forget: (the key was reclaimed)');
SELECT is(lc.try(format($$SELECT idempotency.forget_key('f-fenced', %L)$$, (SELECT token FROM t5))), '55000',
  'forget: a fenced holder''s token 55000');
SELECT is(lc.try(format($$SELECT idempotency.complete_key('f-fenced', %L, '{}'::jsonb)$$, (SELECT token FROM t5))),
  '55000', 'forget: the fenced holder''s complete still gets 55000');
SELECT is(lc.try($$SELECT idempotency.forget_key('f-fenced', NULL, NULL)$$), '22004', 'forget: NULL scope 22004');
SELECT is(lc.try($$SELECT idempotency.forget_key('')$$), '22023', 'forget: empty key 22023');

-- Completed with a token: that token, or none, forgets it; another does not.
CREATE TEMP TABLE t7 AS SELECT * FROM idempotency.claim_key('f-done', NULL::bytea);
SELECT idempotency.complete_key('f-done', (SELECT token FROM t7), '{}'::jsonb);
SELECT is(lc.try($$SELECT idempotency.forget_key('f-done', idempotency.gen_uuid_v7())$$), '55000',
  'forget: a completed key with a token that is not its own 55000');
SELECT is(idempotency.forget_key('f-done', (SELECT token FROM t7)), true, 'forget: a completed key with its token');

-- C++ edition only, from here (shared-memory statistics)
-- Counted in the statistics (with shared memory).
SELECT is(lc.forgotten() - (SELECT forgotten FROM stats_before), 5::bigint,
  'forget: the five keys forgotten are counted in idempotency_stats.forgotten');
-- C++ edition only, to here

-------------------------------------------------------------------------------
-- Tombstones: complete_key(..., response_ttl)
-------------------------------------------------------------------------------
-- The answer of claim_key in one string: status, response, code, whether a body came, and
-- response_dropped.
CREATE FUNCTION lc.claim(k text, fp bytea) RETURNS text LANGUAGE sql AS $$
  SELECT format('%s response=%s code=%s body=%s dropped=%s', status, coalesce(response::text, '-'),
                coalesce(response_code::text, '-'), (response_body IS NOT NULL)::text,
                coalesce(response_dropped::text, '-'))
    FROM idempotency.claim_key(k, fp) $$;
-- Waits until the stored response of the current role's key has passed its time.
CREATE FUNCTION lc.await_response_expiry(k text) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  until timestamptz;
BEGIN
  SELECT response_expires_at INTO until FROM idempotency.idempotency_keys
   WHERE owner = current_user AND scope = '' AND key = k;
  WHILE clock_timestamp() <= until LOOP
    PERFORM pg_sleep(0.05);
  END LOOP;
  RETURN until IS NOT NULL;
END $$;
-- Two-phase (the executor's UPDATE completes) and inbox (the direct path completes the row it
-- inserted, where it may).
CREATE TEMP TABLE tt AS SELECT * FROM idempotency.claim_key('t-two', '\x01'::bytea);
SELECT idempotency.complete_key('t-two', (SELECT token FROM tt), '{"paid": 9}'::jsonb, 201,
                                response_body => '\x0102', response_ttl => '300 ms');
BEGIN;
SELECT idempotency.complete_key('t-inbox', (idempotency.claim_key('t-inbox', '\x01'::bytea)).token,
                                '{"paid": 8}'::jsonb, 202, response_body => '\x03', response_ttl => '300 ms');
COMMIT;
SELECT is(lc.claim('t-two', '\x01'), 'replay response={"paid": 9} code=201 body=true dropped=false',
  'tombstone: before response_ttl, replay with the response (response_dropped false)');
SELECT ok(lc.await_response_expiry('t-two') AND lc.await_response_expiry('t-inbox'), 'tombstone: (response_ttl passed)');
SELECT is(lc.claim('t-two', '\x01'), 'replay response=- code=201 body=false dropped=true',
  'tombstone: after response_ttl, replay without response or body, response_dropped, code kept');
SELECT is(lc.claim('t-inbox', '\x01'), 'replay response=- code=202 body=false dropped=true',
  'tombstone: the same after an inbox completion');
SELECT is(lc.claim('t-two', '\x02'), 'mismatch response=- code=- body=false dropped=-',
  'tombstone: another fingerprint is still a mismatch');
SELECT is((SELECT format('%s %s %s', status, (response IS NULL)::text, response_dropped::text) FROM idempotency.look_key('t-two', '\x01')),
  'replay true true', 'tombstone: look_key says the same');
SELECT is((SELECT expires_at > clock_timestamp() + interval '1 hour' FROM idempotency.idempotency_keys
            WHERE owner = current_user AND key = 't-two'), true, 'tombstone: the key itself stays until its ttl');
-- The cleanup drops the responses past their time, and keeps the keys.
SELECT idempotency.idempotency_cleanup();
SELECT is((SELECT string_agg(format('%s %s %s %s %s', key, (response IS NULL)::text, (response_body IS NULL)::text,
                                    response_code, (response_expires_at IS NOT NULL)::text), ', ' ORDER BY key)
             FROM idempotency.idempotency_keys WHERE owner = current_user AND key IN ('t-two', 't-inbox')),
  't-inbox true true 202 true, t-two true true 201 true',
  'tombstone: the cleanup drops the response, body and headers past their time, and keeps the keys');
SELECT is(lc.claim('t-two', '\x01') || ' / ' || lc.claim('t-two', '\x02'),
  'replay response=- code=201 body=false dropped=true / mismatch response=- code=- body=false dropped=-',
  'tombstone: after the cleanup, still replay (dropped) and mismatch');
CREATE TEMP TABLE tl AS SELECT * FROM idempotency.claim_key('t-long', NULL::bytea, ttl => '1 hour');
SELECT is((SELECT response_dropped::text || ' ' || response::text FROM idempotency.complete_key('t-long', (SELECT token FROM tl), '{"a": 1}'::jsonb, response_ttl => '2 hours')),
  'false {"a": 1}', 'tombstone: complete_key answers with the response');
SELECT is((SELECT response_expires_at IS NULL FROM idempotency.idempotency_keys WHERE owner = current_user AND key = 't-long'), true,
  'tombstone: a response_ttl not shorter than the ttl keeps the response as long as the key');
CREATE TEMP TABLE tz AS SELECT * FROM idempotency.claim_key('t-zero', NULL::bytea);
SELECT is(lc.try(format($$SELECT idempotency.complete_key('t-zero', %L, '{}'::jsonb, response_ttl => '0')$$, (SELECT token FROM tz))),
  '22023', 'tombstone: a response_ttl of zero 22023');
SELECT is(lc.try(format($$SELECT idempotency.complete_key('t-zero', %L, '{}'::jsonb, response_ttl => '-1 s')$$, (SELECT token FROM tz))),
  '22023', 'tombstone: a negative response_ttl 22023');
SELECT is((SELECT status::text FROM idempotency.idempotency_keys WHERE owner = current_user AND key = 't-zero'), 'processing',
  'tombstone: a refused completion changes nothing');

-------------------------------------------------------------------------------
-- key_policy(): the settings in force for this session
-------------------------------------------------------------------------------
-- A setting as the session has it; the portable edition's settings are placeholders that
-- exist only once set, and read as their documented defaults until then.
CREATE FUNCTION lc.setting(name text, fallback text) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce(nullif(current_setting('idempotency.' || name, true), ''), fallback) $$;
SELECT is((SELECT format('%s %s %s %s %s %s', default_ttl = lc.setting('default_ttl', '24h')::interval,
                          max_ttl = lc.setting('max_ttl', '30d')::interval,
                          default_lease = lc.setting('default_lease', '5min')::interval,
                          max_lease = lc.setting('max_lease', '1d')::interval,
                          max_key_length = lc.setting('max_key_length', '255')::int,
                          max_response_size = pg_size_bytes(lc.setting('max_response_size', '1MB')))
             FROM idempotency.key_policy()),
          't t t t t t',
  'key_policy: the settings in force');
SET idempotency.default_ttl = '7d';
SELECT is((SELECT default_ttl FROM idempotency.key_policy()), interval '168 hours', 'key_policy: follows a SET');
SELECT is((SELECT expires_at - created_at FROM idempotency.claim_key('p-1', NULL::bytea, lease => '1 s')), interval '168 hours',
  'key_policy: ... which claim_key applies');
RESET idempotency.default_ttl;

-------------------------------------------------------------------------------
-- Another role's key does not exist for the caller; a role without USAGE cannot call.
-------------------------------------------------------------------------------
SELECT lc.as_role('lc_bob', $$SELECT idempotency.complete_key('shared', (SELECT token FROM idempotency.claim_key('shared')), '{"bob": 1}'::jsonb)::text$$);
CREATE TEMP TABLE t8 AS SELECT * FROM idempotency.claim_key('shared-live', NULL::bytea, lease => '1 hour');
SELECT is(lc.look('shared'), 'claimed token=false attempts=- response=- code=- fp=false retry=-',
  'another role: its completed key is absent for the caller''s look');
SELECT is(lc.as_role('lc_bob', $$SELECT lc.look('shared-live')$$),
  'claimed token=false attempts=- response=- code=- fp=false retry=-',
  'another role: the caller''s live claim is absent for its look');
SELECT is(idempotency.forget_key('shared'), false, 'another role: its key cannot be forgotten (false)');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys WHERE owner = 'lc_bob' AND key = 'shared'), 1,
  'another role: its key is still there');
SELECT is(lc.as_role('lc_bob', $$SELECT idempotency.forget_key('shared-live')::text$$), 'false',
  'another role: the caller''s live claim cannot be forgotten by it');
SELECT is(lc.as_role('lc_bob', $$SELECT lc.look('shared')$$),
  'replay token=false attempts=1 response={"bob": 1} code=- fp=false retry=-',
  'another role: its own look sees its own key');
SELECT is(lc.as_role('lc_nousage', $$SELECT idempotency.look_key('shared')::text$$), '42501',
  'no USAGE: look_key 42501');
SELECT is(lc.as_role('lc_nousage', $$SELECT idempotency.forget_key('shared')::text$$), '42501',
  'no USAGE: forget_key 42501');
SELECT is(lc.as_role('lc_nousage', $$SELECT idempotency.key_policy()::text$$), '42501',
  'no USAGE: key_policy 42501');

-- C++ edition only, from here (the portable edition does not refuse inside security-restricted operations: SECURITY.md)
-- Inside a security-restricted operation (an index expression), both refuse.
CREATE FUNCTION lc.looks(k text) RETURNS text LANGUAGE sql IMMUTABLE AS $$ SELECT (idempotency.look_key(k)).status::text $$;
CREATE TABLE lc.restricted (k text);
INSERT INTO lc.restricted VALUES ('x');
SELECT is(lc.try($$CREATE INDEX ON lc.restricted (lc.looks(k))$$), '42501',
  'a security-restricted operation: look_key 42501');
-- C++ edition only, to here

-------------------------------------------------------------------------------
SELECT * FROM finish();
DELETE FROM idempotency.idempotency_keys WHERE owner LIKE 'lc\_%';
REVOKE ALL ON SCHEMA idempotency FROM lc_bob;
DROP SCHEMA lc CASCADE;
DROP ROLE lc_bob;
DROP ROLE lc_nousage;
SELECT format('ALTER DATABASE %I RESET idempotency.cleanup_worker', current_database()) \gexec
