-- pgTAP: the security suite (SPEC §7, issue #11). One section per attack, each run as
-- unprivileged roles, each asserting that the attack fails with the documented SQLSTATE
-- and leaves nothing behind (role attributes, rows, responses, a live backend).
--
-- Run by test/run.sh in a fresh database with pgtap and idempotency created by the
-- superuser postgres. The database is handed to a non-superuser owner (sec_dbowner);
-- sec_alice and sec_bob are application roles (GRANT USAGE ON SCHEMA idempotency);
-- sec_mallory is hostile and may CREATE in schema sec_shared; sec_nousage has no grant.
-- Roles are cluster-wide: they carry the prefix sec_ and are dropped at the end.
--
-- pgTAP keeps its state in temporary tables of the session's first role, so assertions
-- run as postgres: the attacks run as the other roles through sectest.*_as(role, sql),
-- which does SET ROLE / RESET ROLE around the statement, or at top level between
-- SET ROLE and RESET ROLE with their results kept in psql variables (\gset).
-- Edition: C++ only: the attacks on an extension owned by a superuser (the portable edition: portable_security).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(224);

SELECT pg_backend_pid() AS start_pid \gset
-- The server log of test/run.sh's pgTAP server (lib.sh: DIR/server.log beside DIR/data),
-- read from where it ends now, at the end of the file.
SELECT current_setting('data_directory') || '/../server.log' AS server_log \gset
SELECT coalesce((pg_stat_file(:'server_log', true)).size, -1) AS server_log_start \gset

-------------------------------------------------------------------------------
-- 0. Roles and helpers
-------------------------------------------------------------------------------
CREATE ROLE sec_dbowner;
CREATE ROLE sec_alice;
CREATE ROLE sec_bob;
CREATE ROLE sec_mallory;
CREATE ROLE sec_nousage;
CREATE ROLE sec_gone;
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I OWNER TO sec_dbowner', current_database()); END $$;
-- The one grant an application role needs (SPEC §1).
GRANT USAGE ON SCHEMA idempotency TO sec_dbowner, sec_alice, sec_bob, sec_mallory, sec_gone;
-- The hostile role's playground: a schema where it may create objects.
CREATE SCHEMA sec_shared;
GRANT USAGE ON SCHEMA sec_shared TO PUBLIC;
GRANT CREATE ON SCHEMA sec_shared TO sec_mallory;

-- The attributes every test role was created with: any change is an escalation.
CREATE FUNCTION pg_temp.attributes(role name) RETURNS text LANGUAGE sql AS $$
  SELECT format('super=%s createrole=%s createdb=%s replication=%s bypassrls=%s login=%s',
                rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls, rolcanlogin)
    FROM pg_catalog.pg_roles WHERE rolname = role $$;
\set plain_role '''super=f createrole=f createdb=f replication=f bypassrls=f login=f'''

CREATE SCHEMA sectest;
GRANT USAGE ON SCHEMA sectest TO PUBLIC;
CREATE TABLE sectest.tokens (name text PRIMARY KEY, token uuid);
GRANT ALL ON sectest.tokens TO PUBLIC;
-- The SQLSTATE of `sql` run as the current user ('00000' when it succeeds).
CREATE FUNCTION sectest.state(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE state text;
BEGIN
  EXECUTE sql;
  RETURN '00000';
EXCEPTION WHEN OTHERS OR query_canceled THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
  RETURN state;
END $$;
-- The first column of the first row `sql` returns, as text; 'ERROR <SQLSTATE>' if it fails.
CREATE FUNCTION sectest.value(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE result text; state text;
BEGIN
  EXECUTE sql INTO result;
  RETURN coalesce(result, '<null>');
EXCEPTION WHEN OTHERS OR query_canceled THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE;
  RETURN 'ERROR ' || state;
END $$;
-- Everything an error tells its receiver: SQLSTATE, message, detail, hint.
CREATE FUNCTION sectest.error(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE state text; message text; detail text; hint text;
BEGIN
  EXECUTE sql;
  RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT,
                          detail = PG_EXCEPTION_DETAIL, hint = PG_EXCEPTION_HINT;
  RETURN concat_ws(' | ', state, message, nullif(detail, ''), nullif(hint, ''));
END $$;
-- The same, as `who`: `probe` is one of sectest.state / value / error.
CREATE FUNCTION sectest.run_as(who name, probe text, sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE result text;
BEGIN
  EXECUTE format('SET ROLE %I', who);
  EXECUTE format('SELECT sectest.%I($1)', probe) INTO result USING sql;
  RESET ROLE;
  RETURN result;
END $$;
CREATE FUNCTION sectest.state_as(who name, sql text) RETURNS text LANGUAGE sql AS
  $$ SELECT sectest.run_as(who, 'state', sql) $$;
CREATE FUNCTION sectest.value_as(who name, sql text) RETURNS text LANGUAGE sql AS
  $$ SELECT sectest.run_as(who, 'value', sql) $$;
CREATE FUNCTION sectest.error_as(who name, sql text) RETURNS text LANGUAGE sql AS
  $$ SELECT sectest.run_as(who, 'error', sql) $$;
-- A key row as the superuser sees it (owner, scope, key), in one comparable string.
CREATE FUNCTION sectest.row_of(who name, s text, k text) RETURNS text LANGUAGE sql AS $$
  SELECT coalesce((SELECT format('%s attempts=%s token=%s rp=%s code=%s response=%s',
                                 status, attempts, lease_token IS NOT NULL,
                                 coalesce(recovery_point, '<NULL>'),
                                 coalesce(response_code::text, '<NULL>'),
                                 coalesce(response::text, '<NULL>'))
                     FROM idempotency.idempotency_keys
                    WHERE owner = who::text AND scope = s AND key = k), 'absent') $$;

-------------------------------------------------------------------------------
-- 1. A hostile search_path changes nothing. These are the first calls of the extension
--    in this backend, so its statements are prepared under it. sec_mallory plants
--    look-alike operators, functions, tables (with triggers) and a known salt in the
--    schema she may create in; sec_alice puts that schema first, and a temporary
--    look-alike table before it (pg_temp is where a statement acting as the extension
--    owner would find an unqualified name first after pg_catalog).
-------------------------------------------------------------------------------
SET ROLE sec_mallory;
CREATE TABLE sec_shared.hostile_log (what text);
GRANT INSERT ON sec_shared.hostile_log TO PUBLIC;
CREATE FUNCTION sec_shared.noted(what text) RETURNS void LANGUAGE sql
  AS $$ INSERT INTO sec_shared.hostile_log VALUES (what) $$;
CREATE FUNCTION sec_shared.text_eq(a text, b text) RETURNS boolean LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('text ='); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE OPERATOR sec_shared.= (LEFTARG = text, RIGHTARG = text, FUNCTION = sec_shared.text_eq);
CREATE FUNCTION sec_shared.uuid_eq(a uuid, b uuid) RETURNS boolean LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('uuid ='); RETURN a OPERATOR(pg_catalog.=) b; END $$;
CREATE OPERATOR sec_shared.= (LEFTARG = uuid, RIGHTARG = uuid, FUNCTION = sec_shared.uuid_eq);
CREATE FUNCTION sec_shared.regrole_eq(a regrole, b regrole) RETURNS boolean LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('regrole ='); RETURN a::oid OPERATOR(pg_catalog.=) b::oid; END $$;
CREATE OPERATOR sec_shared.= (LEFTARG = regrole, RIGHTARG = regrole, FUNCTION = sec_shared.regrole_eq);
CREATE FUNCTION sec_shared.ts_gt(a timestamptz, b timestamptz) RETURNS boolean LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('timestamptz >'); RETURN a OPERATOR(pg_catalog.>) b; END $$;
CREATE OPERATOR sec_shared.> (LEFTARG = timestamptz, RIGHTARG = timestamptz, FUNCTION = sec_shared.ts_gt);
CREATE FUNCTION sec_shared.int_plus(a int, b int) RETURNS int LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('int +'); RETURN a OPERATOR(pg_catalog.+) b; END $$;
CREATE OPERATOR sec_shared.+ (LEFTARG = int, RIGHTARG = int, FUNCTION = sec_shared.int_plus);
CREATE FUNCTION sec_shared.now() RETURNS timestamptz LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('now()'); RETURN '2000-01-01'; END $$;
CREATE FUNCTION sec_shared.gen_random_uuid() RETURNS uuid LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('gen_random_uuid()'); RETURN '00000000-0000-0000-0000-000000000000'; END $$;
CREATE FUNCTION sec_shared.sha256(bytea) RETURNS bytea LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('sha256()'); RETURN '\x00'; END $$;
CREATE FUNCTION sec_shared.trap() RETURNS trigger LANGUAGE plpgsql
  AS $$ BEGIN PERFORM sec_shared.noted('trigger on ' || TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME); RETURN NULL; END $$;
CREATE TABLE sec_shared.idempotency_keys (owner regrole, scope text, key text, fingerprint bytea,
  attempts int, ttl interval, lease interval, created_at timestamptz, expires_at timestamptz,
  lease_token uuid, locked_until timestamptz, recovery_point text, status text,
  response_code int, updated_at timestamptz, response jsonb);
INSERT INTO sec_shared.idempotency_keys (owner, scope, key, status, expires_at)
  VALUES ('sec_alice', 'sp-scope', 'sp-1', 'completed', 'infinity');
CREATE TRIGGER trap BEFORE INSERT OR UPDATE OR DELETE ON sec_shared.idempotency_keys
  FOR EACH STATEMENT EXECUTE FUNCTION sec_shared.trap();
GRANT ALL ON sec_shared.idempotency_keys TO PUBLIC;
CREATE TABLE sec_shared.key_lock_salt (salt bytea);
INSERT INTO sec_shared.key_lock_salt VALUES ('\x00000000000000000000000000000000');
GRANT SELECT ON sec_shared.key_lock_salt TO PUBLIC;
RESET ROLE;

SET ROLE sec_alice;
CREATE TEMP TABLE idempotency_keys (LIKE sec_shared.idempotency_keys);
CREATE TRIGGER trap BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.idempotency_keys
  FOR EACH STATEMENT EXECUTE FUNCTION sec_shared.trap();
SET search_path = pg_temp, sec_shared, pg_catalog, public;
-- Control: under this search_path the traps are live.
SELECT 'x' = 'y' AS control_operator, count(*) AS control_rows FROM idempotency_keys \gset
UPDATE idempotency_keys SET key = key WHERE false;
RESET ROLE;
SELECT string_agg(what, ', ' ORDER BY what) AS sp_control FROM sec_shared.hostile_log \gset
DELETE FROM sec_shared.hostile_log;
SET ROLE sec_alice;
SELECT status AS sp_claimed, token AS sp_token
  FROM idempotency.claim_key('sp-1', NULL, 'sp-scope', '1 hour', '10 minutes') \gset
SELECT idempotency.checkpoint_key('sp-1', :'sp_token', 'half-way', 'sp-scope') IS NOT NULL AS sp_checkpointed \gset
SELECT status AS sp_completed FROM idempotency.complete_key('sp-1', :'sp_token', '{"ok": true}', 201, 'sp-scope') \gset
SELECT status AS sp_replay, response_code AS sp_code FROM idempotency.claim_key('sp-1', NULL, 'sp-scope') \gset
SELECT status AS sp_claimed2, token AS sp_token2 FROM idempotency.claim_key('sp-2', NULL, 'sp-scope') \gset
SELECT 't' AS sp_released FROM (SELECT idempotency.release_key('sp-2', :'sp_token2', 'sp-scope')) r \gset
SELECT status AS sp_reclaimed FROM idempotency.claim_key('sp-2', NULL, 'sp-scope') \gset
SELECT current_setting('search_path') AS sp_path_after \gset
RESET search_path;
DROP TABLE pg_temp.idempotency_keys;
RESET ROLE;

SELECT is(regexp_replace(:'sp_control', 'pg_temp_[0-9]+', 'pg_temp'), 'text =, trigger on pg_temp.idempotency_keys',
          'hostile search_path (control): the look-alike operator and the temporary look-alike table catch the caller''s own statements');
SELECT is(:'sp_claimed'::text, 'claimed', 'hostile search_path: claim_key claims');
SELECT is(:'sp_checkpointed'::text, 't', 'hostile search_path: checkpoint_key with the stored lease works');
SELECT is(:'sp_completed'::text, 'replay', 'hostile search_path: complete_key works');
SELECT is(:'sp_replay' || ' ' || :'sp_code', 'replay 201', 'hostile search_path: the duplicate replays the real response');
SELECT is(:'sp_claimed2' || ' ' || :'sp_released' || ' ' || :'sp_reclaimed', 'claimed t reclaimed',
          'hostile search_path: release_key and reclaim work');
SELECT is((SELECT string_agg(what, ', ') FROM sec_shared.hostile_log), NULL,
          'hostile search_path: no look-alike operator, function or trigger was called');
SELECT is((SELECT count(*)::int FROM sec_shared.idempotency_keys WHERE status = 'completed'), 1,
          'hostile search_path: the look-alike table is untouched');
SELECT is(:'sp_path_after'::text, 'pg_temp, sec_shared, pg_catalog, public',
          'hostile search_path: the caller''s search_path is the same after the calls');
SELECT is(sectest.row_of('sec_alice', 'sp-scope', 'sp-1'),
          'completed attempts=1 token=t rp=half-way code=201 response={"ok": true}',
          'hostile search_path: the real table holds the key as it should');
SELECT ok((SELECT created_at > '2020-01-01' FROM idempotency.idempotency_keys
            WHERE owner = 'sec_alice' AND key = 'sp-1'),
          'hostile search_path: times come from the server clock, not a look-alike now()');

-------------------------------------------------------------------------------
-- 2. Database owner -> superuser through the SQL functions (issue #11, attack 1).
--    sec_dbowner owns the database (and therefore schema public). Nothing of the
--    extension may be renamed, replaced, extended or redirected by it.
-------------------------------------------------------------------------------
SELECT is(sectest.state_as('sec_dbowner', cmd), '42501', 'database owner cannot: ' || cmd)
  FROM (VALUES
    (1, 'ALTER SCHEMA idempotency RENAME TO idempotency_old'),
    (2, 'ALTER SCHEMA idempotency OWNER TO sec_dbowner'),
    (3, 'DROP SCHEMA idempotency CASCADE'),
    (4, 'CREATE TABLE idempotency.idempotency_keys_2 (a int)'),
    (5, 'CREATE FUNCTION idempotency.now() RETURNS timestamptz LANGUAGE sql AS ''SELECT pg_catalog.now()'''),
    (6, 'CREATE OR REPLACE FUNCTION idempotency.request_fingerprint(payload text) RETURNS bytea LANGUAGE sql AS ''SELECT NULL::bytea'''),
    (7, 'CREATE OPERATOR idempotency.= (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_catalog.texteq)'),
    (8, 'CREATE VIEW idempotency.v AS SELECT 1'),
    (9, 'ALTER TABLE idempotency.idempotency_keys RENAME TO idempotency_keys_old'),
    (10, 'ALTER TABLE idempotency.idempotency_keys OWNER TO sec_dbowner'),
    (11, 'ALTER TABLE idempotency.idempotency_keys SET SCHEMA public'),
    (12, 'ALTER TABLE idempotency.idempotency_keys ADD COLUMN pwned text'),
    (13, 'CREATE TRIGGER pwn BEFORE INSERT ON idempotency.idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION pg_catalog.suppress_redundant_updates_trigger()'),
    (14, 'CREATE RULE pwn AS ON INSERT TO idempotency.idempotency_keys DO ALSO NOTIFY pwn'),
    (15, 'CREATE POLICY pwn ON idempotency.idempotency_keys USING (true)'),
    (16, 'ALTER TABLE idempotency.idempotency_keys ENABLE ROW LEVEL SECURITY'),
    (17, 'CREATE INDEX pwn ON idempotency.idempotency_keys (key)'),
    (18, 'CREATE STATISTICS public.pwn ON scope, key FROM idempotency.idempotency_keys'),
    (19, 'ALTER TABLE idempotency.idempotency_keys SET (autovacuum_enabled = false)'),
    (20, 'CLUSTER idempotency.idempotency_keys USING idempotency_keys_expires_at_idx'),
    (21, 'LOCK TABLE idempotency.idempotency_keys IN ACCESS EXCLUSIVE MODE'),
    (22, 'SELECT count(*) FROM idempotency.idempotency_keys'),
    (23, 'UPDATE idempotency.idempotency_keys SET response = NULL'),
    (24, 'DELETE FROM idempotency.idempotency_keys'),
    (25, 'TRUNCATE idempotency.idempotency_keys'),
    (26, 'GRANT SELECT ON idempotency.idempotency_keys TO sec_dbowner'),
    (27, 'COMMENT ON TABLE idempotency.idempotency_keys IS ''pwned'''),
    (28, 'ALTER TABLE idempotency.key_lock_salt RENAME TO salt_old'),
    (29, 'SELECT salt FROM idempotency.key_lock_salt'),
    (30, 'UPDATE idempotency.key_lock_salt SET salt = ''\x00'''),
    (31, 'ALTER FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval) SECURITY DEFINER'),
    (32, 'ALTER FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval) OWNER TO sec_dbowner'),
    (33, 'ALTER FUNCTION idempotency.checkpoint_key(text, uuid, text, text, interval) SET search_path = public'),
    (34, 'ALTER FUNCTION idempotency.release_key(text, uuid, text) RENAME TO release_key_old'),
    (35, 'ALTER TYPE idempotency.key_status ADD VALUE ''pwned'''),
    (36, 'ALTER TYPE idempotency.claim_result ADD ATTRIBUTE pwned text'),
    (37, 'ALTER VIEW idempotency.idempotency_stats OWNER TO sec_dbowner'),
    (38, 'ALTER EXTENSION idempotency UPDATE'),
    (39, 'ALTER EXTENSION idempotency UPDATE TO ''1.0'''),
    (40, 'DROP EXTENSION idempotency'),
    (41, 'DROP EXTENSION idempotency CASCADE'),
    (42, 'ALTER EXTENSION idempotency SET SCHEMA public'),
    (43, 'ALTER EXTENSION idempotency DROP TABLE idempotency.key_lock_salt'),
    (44, 'ALTER EXTENSION idempotency ADD SCHEMA public'),
    (45, format('ALTER DATABASE %I SET idempotency.max_lease = ''100 years''', current_database())),
    (46, format('ALTER DATABASE %I SET idempotency.max_key_length = 1024', current_database())),
    (47, 'SET idempotency.max_ttl = ''100 years'''),
    (48, 'SET idempotency.max_key_length = 1024'),
    (49, 'SET idempotency.max_fingerprint_size = 1024'),
    (50, 'SET idempotency.max_recovery_point_size = ''1MB'''),
    (51, 'SET idempotency.max_response_size = ''100MB'''),
    (52, 'SELECT idempotency.idempotency_cleanup()'),
    (53, 'SELECT * FROM idempotency.idempotency_stats'),
    (54, 'ALTER ROLE sec_dbowner SUPERUSER')
  ) AS t(n, cmd)
 ORDER BY n;

-- The look-alike attack of the issue: public renamed, a schema of the old name (and
-- every other schema the DB owner controls, and a temporary table) holding a look-alike
-- idempotency_keys with triggers that log and try ALTER ROLE ... SUPERUSER as whoever
-- fires them, rows that match the keys it is about to use, and a known salt.
SET ROLE sec_dbowner;
CREATE SCHEMA sec_attacker;
CREATE TABLE sec_attacker.log (who name, what text);
GRANT ALL ON sec_attacker.log TO PUBLIC;
CREATE FUNCTION sec_attacker.pwn() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO sec_attacker.log VALUES (current_user,
    format('%s.%s %s %s %s', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_WHEN, TG_OP, TG_LEVEL));
  BEGIN
    EXECUTE 'ALTER ROLE sec_dbowner SUPERUSER';
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
  IF TG_LEVEL = 'ROW' THEN RETURN coalesce(NEW, OLD); END IF;
  RETURN NULL;
END $$;
CREATE FUNCTION sec_attacker.plant(target text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format('CREATE TABLE %I.idempotency_keys (owner regrole NOT NULL, scope text COLLATE "C" NOT NULL DEFAULT '''','
                 ' key text COLLATE "C" NOT NULL, fingerprint bytea, attempts int NOT NULL DEFAULT 1, ttl interval,'
                 ' lease interval, created_at timestamptz, expires_at timestamptz, lease_token uuid,'
                 ' locked_until timestamptz, recovery_point text, status text, response_code int,'
                 ' updated_at timestamptz, response jsonb, PRIMARY KEY (owner, scope, key))', target);
  -- Live rows for every key the attack uses, and expired ones for a cleanup.
  EXECUTE format('INSERT INTO %I.idempotency_keys SELECT ''sec_dbowner'', '''', k, NULL, 1, ''1 day'', ''1 hour'','
                 ' now(), now() + ''1 day''::interval, NULL, now() + ''1 hour''::interval, NULL, ''processing'', NULL, now(), NULL'
                 ' FROM (SELECT ''dk'' || g FROM generate_series(1, 40) g UNION ALL SELECT ''dk-top'') AS keys(k)', target);
  EXECUTE format('INSERT INTO %I.idempotency_keys SELECT ''sec_dbowner'', ''old'', ''ok'' || g, NULL, 1, ''1 day'','
                 ' ''1 hour'', now(), now() - ''1 day''::interval, NULL, NULL, NULL, ''processing'', NULL, now(), NULL'
                 ' FROM generate_series(1, 5) g', target);
  EXECUTE format('CREATE TRIGGER pwn_statement BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %I.idempotency_keys'
                 ' FOR EACH STATEMENT EXECUTE FUNCTION sec_attacker.pwn()', target);
  EXECUTE format('CREATE TRIGGER pwn_row BEFORE INSERT OR UPDATE OR DELETE ON %I.idempotency_keys'
                 ' FOR EACH ROW EXECUTE FUNCTION sec_attacker.pwn()', target);
  EXECUTE format('GRANT ALL ON %I.idempotency_keys TO PUBLIC', target);
  EXECUTE format('CREATE TABLE %I.key_lock_salt AS SELECT ''\x00000000000000000000000000000000''::bytea AS salt', target);
  EXECUTE format('GRANT ALL ON %I.key_lock_salt TO PUBLIC', target);
END $$;
ALTER SCHEMA public RENAME TO sec_public_saved;
CREATE SCHEMA public;
CREATE SCHEMA sec_dbowner;
SELECT sec_attacker.plant(s) FROM unnest(ARRAY['public', 'sec_dbowner', 'sec_attacker', 'pg_temp']) s;
SET search_path = pg_temp, "$user", public, sec_attacker, pg_catalog;
-- Control: the look-alikes' triggers fire (here for the DB owner itself, whom ALTER ROLE
-- refuses), then the log is emptied.
UPDATE pg_temp.idempotency_keys SET key = key WHERE false;
UPDATE public.idempotency_keys SET key = key WHERE false;
SELECT count(*) AS attack_control FROM sec_attacker.log \gset
DELETE FROM sec_attacker.log;

-- Many calls, each kind, with every kept plan invalidated by schema renames in between.
SELECT sectest.state($attack$
DO $$
DECLARE t uuid;
BEGIN
  FOR i IN 1..40 LOOP
    t := (idempotency.claim_key('dk' || i, NULL, '', '1 hour', '10 minutes')).token;
    EXECUTE 'ALTER SCHEMA public RENAME TO sec_swap';
    EXECUTE 'ALTER SCHEMA sec_swap RENAME TO public';
    PERFORM idempotency.checkpoint_key('dk' || i, t, 'step-1');
    EXECUTE 'ALTER SCHEMA public RENAME TO sec_swap';
    EXECUTE 'ALTER SCHEMA sec_swap RENAME TO public';
    PERFORM idempotency.checkpoint_key('dk' || i, t, 'step-2', '', '5 minutes');
    IF i % 4 = 0 THEN
      PERFORM idempotency.release_key('dk' || i, t);
    ELSE
      PERFORM idempotency.complete_key('dk' || i, t, pg_catalog.jsonb_build_object('i', i), 200);
    END IF;
    PERFORM idempotency.claim_key('dk' || i, NULL, '', '1 hour', '10 minutes');
  END LOOP;
END $$
$attack$) AS attack_loop \gset

-- The same across statements and transactions, with a new schema of the old name each time.
ALTER SCHEMA public RENAME TO sec_lookalike_1;
CREATE SCHEMA public;
SELECT sec_attacker.plant('public');
SELECT status AS top_claimed, token AS top_token
  FROM idempotency.claim_key('dk-top', NULL, '', '1 hour', '10 minutes') \gset
ALTER SCHEMA public RENAME TO sec_lookalike_2;
CREATE SCHEMA public;
SELECT sec_attacker.plant('public');
SELECT idempotency.checkpoint_key('dk-top', :'top_token', 'top-1') IS NOT NULL AS top_checkpointed \gset
ALTER SCHEMA public RENAME TO sec_lookalike_3;
CREATE SCHEMA public;
SELECT sec_attacker.plant('public');
SELECT status AS top_completed FROM idempotency.complete_key('dk-top', :'top_token', '{"top": true}') \gset
-- The error paths (the fence explained from a fresh read): the old SIGSEGV was here.
SELECT sectest.value($$SELECT idempotency.checkpoint_key('dk-none', '018f0000-0000-7000-8000-000000000000', 'x')$$) AS err_checkpoint_absent \gset
SELECT sectest.value($$SELECT idempotency.checkpoint_key('dk4', '018f0000-0000-7000-8000-000000000000', 'x')$$) AS err_checkpoint_released \gset
SELECT sectest.value($$SELECT idempotency.checkpoint_key('dk1', '018f0000-0000-7000-8000-000000000000', 'x', '', '1 minute')$$) AS err_checkpoint_completed \gset
SELECT sectest.value($$SELECT idempotency.release_key('dk1', '018f0000-0000-7000-8000-000000000000')$$) AS err_release_completed \gset
SELECT sectest.value($$SELECT idempotency.complete_key('dk1', '018f0000-0000-7000-8000-000000000000', '{}')$$) AS err_complete_other \gset
SELECT sectest.value($$SELECT status FROM idempotency.complete_key('dk-top', '$$ || :'top_token' || $$', '{"top": true}')$$) AS top_again \gset
RESET search_path;
ALTER SCHEMA public RENAME TO sec_lookalike_4;
ALTER SCHEMA sec_public_saved RENAME TO public;
RESET ROLE;

SELECT is(:'attack_control'::int, 2, 'db owner attack (control): the look-alikes'' triggers fire and log');
SELECT is(:'attack_loop'::text, '00000', 'db owner attack: 40 rounds of claim / checkpoint / complete / release with schema swaps succeed');
SELECT is(:'top_claimed' || ' ' || :'top_checkpointed' || ' ' || :'top_completed', 'claimed t replay',
          'db owner attack: calls across statements, each after a new look-alike schema, succeed');
SELECT is(:'err_checkpoint_absent'::text, 'ERROR P0002', 'db owner attack: checkpoint_key of an absent key (stored lease) answers P0002, no crash');
SELECT is(:'err_checkpoint_released'::text, 'ERROR 55000', 'db owner attack: checkpoint_key of a released and reclaimed key with a wrong token answers 55000');
SELECT is(:'err_checkpoint_completed'::text, 'ERROR 55000', 'db owner attack: checkpoint_key of a completed key answers 55000');
SELECT is(:'err_release_completed'::text, 'ERROR 55000', 'db owner attack: release_key of a completed key answers 55000');
SELECT is(:'err_complete_other'::text, 'ERROR 55000', 'db owner attack: complete_key with a wrong token answers 55000');
SELECT is(:'top_again'::text, 'replay', 'db owner attack: completing again with the same token and response is a no-op');
SELECT is(pg_temp.attributes('sec_dbowner'), :plain_role, 'db owner attack: sec_dbowner did not gain any attribute');
SELECT is((SELECT string_agg(who || ': ' || what, '; ') FROM sec_attacker.log), NULL,
          'db owner attack: no look-alike trigger ever ran');
SELECT is((SELECT count(*)::int FROM (
             SELECT status, response FROM sec_lookalike_1.idempotency_keys
             UNION ALL SELECT status, response FROM sec_lookalike_2.idempotency_keys
             UNION ALL SELECT status, response FROM sec_lookalike_3.idempotency_keys
             UNION ALL SELECT status, response FROM sec_lookalike_4.idempotency_keys
             UNION ALL SELECT status, response FROM sec_dbowner.idempotency_keys
             UNION ALL SELECT status, response FROM sec_attacker.idempotency_keys) planted
            WHERE status = 'processing' AND response IS NULL), 6 * 46,
          'db owner attack: every planted look-alike row is untouched');
SELECT is((SELECT string_agg(DISTINCT format('%s attempts=%s %s', status, attempts, recovery_point), ', ') || ' x' || count(*)
             FROM idempotency.idempotency_keys
            WHERE owner = 'sec_dbowner' AND key IN (SELECT 'dk' || g FROM generate_series(4, 40, 4) g)),
          'processing attempts=2 step-2 x10', 'db owner attack: the released keys are in the real table, reclaimed, with their checkpoint');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys
            WHERE owner = 'sec_dbowner' AND key IN (SELECT 'dk' || g FROM generate_series(1, 40) g WHERE g % 4 <> 0)
              AND status = 'completed' AND 'dk' || (response->>'i') = key AND response_code = 200
              AND recovery_point = 'step-2'),
          30, 'db owner attack: the completed keys are in the real table with their responses');
SELECT is(pg_backend_pid(), :start_pid, 'db owner attack: the backend is the same one (no crash)');

-------------------------------------------------------------------------------
-- 3. Confused deputies (issue #11, attack 3).
-------------------------------------------------------------------------------
-- (a) sec_mallory's SECURITY DEFINER helpers, called by sec_alice, act for sec_mallory.
SELECT is(sectest.value_as('sec_alice', $$SELECT status FROM idempotency.complete_key('deputy-k',
            (idempotency.claim_key('deputy-k', NULL, 'dep')).token, '{"secret": "alice-only"}', 200, 'dep')$$),
          'replay', 'deputy: alice completed her key with a secret response');
SELECT is(sectest.value_as('sec_alice', $$INSERT INTO sectest.tokens SELECT 'deputy-open', token
            FROM idempotency.claim_key('deputy-open', NULL, 'dep', NULL, '1 hour') RETURNING 'stored'$$),
          'stored', 'deputy: alice holds an open claim');
SET ROLE sec_mallory;
CREATE TABLE sec_shared.loot (via text, what jsonb);
GRANT INSERT ON sec_shared.loot TO PUBLIC;
CREATE FUNCTION sec_shared.helper_claim(k text, s text) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE r record;
BEGIN
  SELECT * INTO r FROM idempotency.claim_key(k, NULL, s);
  INSERT INTO sec_shared.loot VALUES ('definer claim_key', to_jsonb(r));
  RETURN r.status::text || coalesce(' ' || r.response::text, '');
END $$;
CREATE FUNCTION sec_shared.helper_complete(k text, s text, t uuid) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE r record;
BEGIN
  SELECT * INTO r FROM idempotency.complete_key(k, t, '{"by": "mallory"}', 500, s);
  INSERT INTO sec_shared.loot VALUES ('definer complete_key', to_jsonb(r));
  RETURN r.status::text;
END $$;
CREATE FUNCTION sec_shared.helper_release(k text, s text, t uuid) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
  PERFORM idempotency.release_key(k, t, s);
  RETURN 'released';
END $$;
CREATE FUNCTION sec_shared.helper_checkpoint(k text, s text, t uuid) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
  RETURN idempotency.checkpoint_key(k, t, 'mallory was here', s)::text;
END $$;
RESET ROLE;
SELECT is(sectest.value_as('sec_alice', $$SELECT sec_shared.helper_claim('deputy-k', 'dep')$$), 'claimed',
          'deputy: claim_key in mallory''s definer function acts for mallory (a fresh claim, no response)');
SELECT is((SELECT count(*)::int FROM sec_shared.loot WHERE what::text LIKE '%alice-only%'), 0,
          'deputy: nothing of alice''s response reached mallory''s table');
SELECT is(sectest.row_of('sec_mallory', 'dep', 'deputy-k'), 'processing attempts=1 token=t rp=<NULL> code=<NULL> response=<NULL>',
          'deputy: the key claimed is mallory''s own');
SELECT is(sectest.value_as('sec_alice', $$SELECT sec_shared.helper_complete('deputy-open', 'dep', (SELECT token FROM sectest.tokens WHERE name = 'deputy-open'))$$),
          'ERROR P0002', 'deputy: complete_key with alice''s token in mallory''s definer function: P0002');
SELECT is(sectest.value_as('sec_alice', $$SELECT sec_shared.helper_release('deputy-open', 'dep', (SELECT token FROM sectest.tokens WHERE name = 'deputy-open'))$$),
          'ERROR P0002', 'deputy: release_key with alice''s token in mallory''s definer function: P0002');
SELECT is(sectest.value_as('sec_alice', $$SELECT sec_shared.helper_checkpoint('deputy-open', 'dep', (SELECT token FROM sectest.tokens WHERE name = 'deputy-open'))$$),
          'ERROR P0002', 'deputy: checkpoint_key with alice''s token in mallory''s definer function: P0002');
SELECT is(sectest.row_of('sec_alice', 'dep', 'deputy-k'), 'completed attempts=1 token=t rp=<NULL> code=200 response={"secret": "alice-only"}',
          'deputy: alice''s completed key is unchanged');
SELECT is(sectest.row_of('sec_alice', 'dep', 'deputy-open'), 'processing attempts=1 token=t rp=<NULL> code=<NULL> response=<NULL>',
          'deputy: alice''s open claim is unchanged');
SELECT is(sectest.value_as('sec_alice', $$SELECT status FROM idempotency.complete_key('deputy-open', (SELECT token FROM sectest.tokens WHERE name = 'deputy-open'), '{"mine": true}', 200, 'dep')$$),
          'replay', 'deputy: alice still completes her claim with her token');

-- (b) An expression index of mallory's whose lying IMMUTABLE function calls claim_key:
-- ANALYZE / REINDEX by a superuser evaluate it as mallory inside a security-restricted
-- operation, where claim_key refuses (42501) instead of acting for anyone.
SELECT is((idempotency.complete_key('su-secret', (idempotency.claim_key('su-secret')).token,
           '{"secret": "superuser-only"}')).status::text, 'replay', 'deputy: the superuser holds a completed key with a secret');
SET ROLE sec_mallory;
CREATE FUNCTION sec_shared.steal(k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
  SELECT * INTO r FROM idempotency.claim_key(k);
  INSERT INTO sec_shared.loot VALUES ('index expression as ' || current_user, to_jsonb(r));
  RETURN k;
END $$;
CREATE FUNCTION sec_shared.note(what text) RETURNS void LANGUAGE sql
  AS $$ INSERT INTO sec_shared.loot VALUES (what, NULL) $$;
CREATE FUNCTION sec_shared.lying(k text) RETURNS text LANGUAGE plpgsql IMMUTABLE
  AS $$ BEGIN RETURN sec_shared.steal(k); END $$;
-- The same, swallowing the refusal, so that the command succeeds and the loot tells.
CREATE FUNCTION sec_shared.lying_quietly(k text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
  RETURN sec_shared.steal(k);
EXCEPTION WHEN OTHERS THEN
  PERFORM sec_shared.note('refused ' || SQLSTATE);
  RETURN k;
END $$;
CREATE TABLE sec_shared.bait (k text);
CREATE INDEX bait_idx ON sec_shared.bait (sec_shared.lying(k));
CREATE TABLE sec_shared.bait_quiet (k text);
CREATE INDEX bait_quiet_idx ON sec_shared.bait_quiet (sec_shared.lying_quietly(k));
-- Evaluated now for mallory, as mallory: her own fresh keys.
INSERT INTO sec_shared.bait VALUES ('su-secret');
INSERT INTO sec_shared.bait_quiet VALUES ('su-secret');
DELETE FROM sec_shared.loot;
CREATE MATERIALIZED VIEW sec_shared.mv AS SELECT sec_shared.steal('su-secret') AS k WITH NO DATA;
RESET ROLE;
SELECT throws_ok('ANALYZE sec_shared.bait', '42501', 'cannot call claim_key inside a security-restricted operation',
                 'deputy: a superuser''s ANALYZE of mallory''s expression index fails with 42501 from claim_key');
SELECT throws_ok('REINDEX TABLE sec_shared.bait', '42501', 'cannot call claim_key inside a security-restricted operation',
                 'deputy: a superuser''s REINDEX of it fails with 42501 too');
SELECT lives_ok('ANALYZE sec_shared.bait_quiet', 'deputy: ANALYZE with a function that swallows the refusal completes');
SELECT is((SELECT string_agg(DISTINCT via, ', ') FROM sec_shared.loot), 'refused 42501',
          'deputy: inside ANALYZE, claim_key refused (42501) and returned nothing');
SELECT throws_ok('REFRESH MATERIALIZED VIEW sec_shared.mv', '42501', NULL,
                 'deputy: REFRESH MATERIALIZED VIEW over a function calling claim_key fails with 42501 (superuser)');
SELECT is(sectest.state_as('sec_mallory', 'REFRESH MATERIALIZED VIEW sec_shared.mv'), '42501',
          'deputy: REFRESH MATERIALIZED VIEW fails with 42501 (owner)');
SELECT is(sectest.state_as('sec_mallory', $$CREATE MATERIALIZED VIEW sec_shared.mv2 AS SELECT (idempotency.claim_key('su-secret')).response$$),
          '42501', 'deputy: CREATE MATERIALIZED VIEW ... WITH DATA over claim_key fails with 42501');
CREATE MATERIALIZED VIEW sectest.mv_cleanup AS SELECT idempotency.idempotency_cleanup() AS n WITH NO DATA;
SELECT throws_ok('REFRESH MATERIALIZED VIEW sectest.mv_cleanup', '42501', NULL,
                 'deputy: idempotency_cleanup() refuses inside a security-restricted operation too');
SELECT is((SELECT count(*)::int FROM sec_shared.loot WHERE what::text LIKE '%superuser-only%'), 0,
          'deputy: the superuser''s response never reached mallory''s table');
SELECT is(sectest.row_of('postgres', '', 'su-secret'), 'completed attempts=1 token=t rp=<NULL> code=<NULL> response={"secret": "superuser-only"}',
          'deputy: the superuser''s key is unchanged');

-------------------------------------------------------------------------------
-- 4. Squatting (issue #11, attack 4): bounded ttl and lease, and bob's claims are bob's.
-------------------------------------------------------------------------------
SELECT is(sectest.value_as('sec_bob', sql), expected, 'squatting: ' || what)
  FROM (VALUES
    (1, $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', NULL, '200000 years')$$, 'ERROR 22023', 'a lease of 200000 years'),
    (2, $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', '200000 years', '1 hour')$$, 'ERROR 22023', 'a ttl of 200000 years'),
    (3, $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', NULL, '178000000 years')$$, 'ERROR 22023', 'a lease past the int64 range'),
    (4, $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', NULL, '1 day 1 second')$$, 'ERROR 22023', 'a lease one second over idempotency.max_lease (1 day)'),
    (5, $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', '30 days 1 second')$$, 'ERROR 22023', 'a ttl one second over idempotency.max_ttl (30 days)'),
    (6, $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', '1 mon 1 second')$$, 'ERROR 22023', 'a ttl of 1 month and 1 second'),
    (7, $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', '-1 second')$$, 'ERROR 22023', 'a negative ttl'),
    (8, $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', NULL, '0')$$, 'ERROR 22023', 'a zero lease'),
    -- The defaults are a superuser's to set since 1.2 (issue #20 item 9): bob cannot.
    (9, $$SELECT c.status FROM (SELECT set_config('idempotency.default_lease', '2d', true) AS v) s,
          LATERAL idempotency.claim_key('k', NULL, 'alice-scope' || left(s.v, 0)) c$$, 'ERROR 42501', 'bob cannot set idempotency.default_lease'),
    (10, $$SELECT c.status FROM (SELECT set_config('idempotency.default_ttl', '31d', true) AS v) s,
          LATERAL idempotency.claim_key('k', NULL, 'alice-scope' || left(s.v, 0)) c$$, 'ERROR 42501', 'bob cannot set idempotency.default_ttl')
  ) AS t(n, sql, expected, what)
 ORDER BY n;
-- A superuser's defaults are held to the maxima all the same.
SELECT is(sectest.value($$SELECT c.status FROM (SELECT set_config('idempotency.default_lease', '2d', true) AS v) s,
            LATERAL idempotency.claim_key('k', NULL, 'alice-scope' || left(s.v, 0)) c$$), 'ERROR 22023',
          'squatting: idempotency.default_lease set above the maximum (by a superuser) is refused');
SELECT is(sectest.value($$SELECT c.status FROM (SELECT set_config('idempotency.default_ttl', '31d', true) AS v) s,
            LATERAL idempotency.claim_key('k', NULL, 'alice-scope' || left(s.v, 0)) c$$), 'ERROR 22023',
          'squatting: idempotency.default_ttl set above the maximum (by a superuser) is refused');
SELECT is(sectest.row_of('sec_bob', 'alice-scope', 'k'), 'absent', 'squatting: the refused claims stored nothing');
SELECT is(sectest.value_as('sec_bob', $$SELECT status FROM idempotency.claim_key('edge', NULL, 'alice-scope', '30 days', '1 day')$$),
          'claimed', 'squatting: ttl and lease exactly at their maxima are accepted');
SELECT is(sectest.value_as('sec_bob', $$SELECT idempotency.checkpoint_key('edge2', token, 'x', 'alice-scope', '200000 years')
            FROM idempotency.claim_key('edge2', NULL, 'alice-scope') c$$), 'ERROR 22023',
          'squatting: checkpoint_key cannot renew a lease past the maximum either');
SELECT is(sectest.value_as('sec_bob', $$SELECT status FROM idempotency.claim_key('k', NULL, 'alice-scope', NULL, '1 day')$$),
          'claimed', 'squatting: bob claims (alice-scope, k) with a legal lease');
SELECT is(sectest.value_as('sec_alice', $$INSERT INTO sectest.tokens SELECT 'alice-k', token
            FROM idempotency.claim_key('k', NULL, 'alice-scope') WHERE status = 'claimed' RETURNING 'claimed'$$),
          'claimed', 'squatting: alice''s claim of the same (scope, key) is claimed all the same');
SELECT is(sectest.value_as('sec_alice', $$SELECT status FROM idempotency.complete_key('k',
            (SELECT token FROM sectest.tokens WHERE name = 'alice-k'), '{"for": "alice"}', 200, 'alice-scope')$$),
          'replay', 'squatting: alice completes her key');
SELECT is(sectest.value_as('sec_bob', $$SELECT status || coalesce(' ' || response::text, '') FROM idempotency.claim_key('k', NULL, 'alice-scope')$$),
          'in_progress', 'squatting: bob''s duplicate sees only his own claim, never alice''s response');
-- A token does not carry a key to another role: bob with alice's token gets P0002.
SELECT is(sectest.value_as('sec_alice', $$INSERT INTO sectest.tokens SELECT 'alice-open', token
            FROM idempotency.claim_key('open', NULL, 'alice-scope', NULL, '1 hour') RETURNING 'stored'$$),
          'stored', 'squatting: alice holds another open claim');
SELECT is(sectest.value_as('sec_bob', sql), 'ERROR P0002', 'squatting: bob with alice''s token: ' || what)
  FROM (VALUES
    (1, $$SELECT idempotency.complete_key('open', (SELECT token FROM sectest.tokens WHERE name = 'alice-open'), '{"by": "bob"}', 200, 'alice-scope')$$, 'complete_key'),
    (2, $$SELECT idempotency.release_key('open', (SELECT token FROM sectest.tokens WHERE name = 'alice-open'), 'alice-scope')$$, 'release_key'),
    (3, $$SELECT idempotency.checkpoint_key('open', (SELECT token FROM sectest.tokens WHERE name = 'alice-open'), 'bob', 'alice-scope')$$, 'checkpoint_key'),
    (4, $$SELECT idempotency.checkpoint_key('open', (SELECT token FROM sectest.tokens WHERE name = 'alice-open'), 'bob', 'alice-scope', '1 hour')$$, 'checkpoint_key with a lease')
  ) AS t(n, sql, what)
 ORDER BY n;
-- Even in the transaction where alice's claim was made (the claim's own fast path).
CREATE FUNCTION sectest.switch_in_transaction() RETURNS text LANGUAGE plpgsql AS $$
DECLARE t uuid; result text;
BEGIN
  SET ROLE sec_alice;
  t := (idempotency.claim_key('switch', NULL, 'alice-scope')).token;
  SET ROLE sec_bob;
  BEGIN
    PERFORM idempotency.complete_key('switch', t, '{"by": "bob"}', NULL, 'alice-scope');
    result := 'completed by bob';
  EXCEPTION WHEN OTHERS THEN
    result := SQLSTATE;
  END;
  RESET ROLE;
  RETURN result;
END $$;
SELECT is(sectest.switch_in_transaction(), 'P0002',
          'squatting: bob cannot complete with a token alice claimed earlier in the same transaction');
SELECT is(sectest.row_of('sec_alice', 'alice-scope', 'open') || ' / ' || sectest.row_of('sec_alice', 'alice-scope', 'switch'),
          'processing attempts=1 token=t rp=<NULL> code=<NULL> response=<NULL> / processing attempts=1 token=t rp=<NULL> code=<NULL> response=<NULL>',
          'squatting: alice''s claims are unchanged');
SELECT is((SELECT string_agg(key, ', ' ORDER BY key) FROM idempotency.idempotency_keys WHERE owner = 'sec_bob'),
          'edge, k', 'squatting: bob owns only what he claimed and was accepted');

-------------------------------------------------------------------------------
-- 5. Existence oracle (issue #11, attack 5): another role's live or completed key and
--    an absent key give bob the same answer, in every field of the error.
-------------------------------------------------------------------------------
SELECT is(sectest.value_as('sec_alice', $$SELECT count(*) FROM (
            SELECT idempotency.claim_key('ora-live', '\x01', 'ora', NULL, '1 hour')
            UNION ALL SELECT idempotency.complete_key('ora-done', (idempotency.claim_key('ora-done', '\x02', 'ora')).token, '{"x": 1}', 200, 'ora')) s$$),
          '2', 'oracle: alice has a live claim and a completed key');
SELECT is(count(DISTINCT replace(sectest.error_as('sec_bob', format(call, k)), k, '<key>'))::int, 1,
          'oracle: ' || fn || ' answers identically for another role''s live, completed and an absent key')
  FROM (VALUES
    (1, 'release_key', $$SELECT idempotency.release_key(%L, gen_random_uuid(), 'ora')$$),
    (2, 'complete_key', $$SELECT idempotency.complete_key(%L, gen_random_uuid(), '{}', NULL, 'ora')$$),
    (3, 'checkpoint_key (stored lease)', $$SELECT idempotency.checkpoint_key(%L, gen_random_uuid(), 'x', 'ora')$$),
    (4, 'checkpoint_key (new lease)', $$SELECT idempotency.checkpoint_key(%L, gen_random_uuid(), 'x', 'ora', '1 minute')$$)
  ) AS t(n, fn, call), unnest(ARRAY['ora-live', 'ora-done', 'ora-none']) AS k
 GROUP BY n, fn
 ORDER BY n;
SELECT is(sectest.error_as('sec_bob', $$SELECT idempotency.release_key('ora-live', gen_random_uuid(), 'ora')$$),
          'P0002 | idempotency key "ora-live" in scope "ora" does not exist or has expired',
          'oracle: that answer is P0002, the one for an absent key');
SELECT is(string_agg(sectest.value_as('sec_bob',
            format($$SELECT format('%%s %%s %%s %%s', status, attempts, fingerprint, coalesce(recovery_point, '<NULL>')) FROM idempotency.claim_key(%L, '\x03', 'ora')$$, k)),
            ' / ' ORDER BY k),
          'claimed 1 \x03 <NULL> / claimed 1 \x03 <NULL> / claimed 1 \x03 <NULL>',
          'oracle: claim_key answers claimed for another role''s live, completed and an absent key')
  FROM unnest(ARRAY['ora-done', 'ora-live', 'ora-none']) AS k;
SELECT is(sectest.row_of('sec_alice', 'ora', 'ora-live') || ' / ' || sectest.row_of('sec_alice', 'ora', 'ora-done'),
          'processing attempts=1 token=t rp=<NULL> code=<NULL> response=<NULL> / completed attempts=1 token=t rp=<NULL> code=200 response={"x": 1}',
          'oracle: alice''s keys are unchanged');

-------------------------------------------------------------------------------
-- 6. Unbounded values (issue #11, attack 6), and least privilege.
-------------------------------------------------------------------------------
SELECT count(*) AS alice_rows_before FROM idempotency.idempotency_keys WHERE owner = 'sec_alice' \gset
-- A 100 MB value kept compressed in a table: refused by its size, never detoasted.
CREATE TABLE sectest.big AS SELECT repeat('y', 100 * 1024 * 1024) AS v, convert_to(repeat('y', 100 * 1024 * 1024), 'UTF8') AS b;
GRANT SELECT ON sectest.big TO PUBLIC;
SELECT is(sectest.value_as('sec_alice', sql), expected, 'unbounded: ' || what)
  FROM (VALUES
    (1, $$SELECT status FROM idempotency.claim_key('big-fp', convert_to(repeat('x', 100 * 1024 * 1024), 'UTF8'))$$, 'ERROR 22001', 'a 100 MB fingerprint'),
    (2, $$SELECT status FROM idempotency.claim_key('big-fp2', (SELECT b FROM sectest.big))$$, 'ERROR 22001', 'a 100 MB fingerprint from a table'),
    (3, $$SELECT status FROM idempotency.claim_key('fp-64', convert_to(repeat('f', 64), 'UTF8'))$$, 'claimed', 'a fingerprint of 64 bytes (the maximum)'),
    (4, $$SELECT status FROM idempotency.claim_key('fp-65', convert_to(repeat('f', 65), 'UTF8'))$$, 'ERROR 22001', 'a fingerprint of 65 bytes'),
    (5, $$SELECT idempotency.checkpoint_key('rp', token, repeat('y', 100 * 1024 * 1024)) FROM idempotency.claim_key('rp') c$$, 'ERROR 22001', 'a 100 MB recovery point'),
    (6, $$SELECT idempotency.checkpoint_key('rp', token, (SELECT v FROM sectest.big)) FROM idempotency.claim_key('rp') c$$, 'ERROR 22001', 'a 100 MB recovery point kept compressed in a table'),
    (7, $$SELECT idempotency.checkpoint_key('rp', token, repeat('€', 341) || 'z') IS NOT NULL FROM idempotency.claim_key('rp') c$$, 'true', 'a recovery point of 1024 bytes (the maximum, multibyte)'),
    (8, $$SELECT idempotency.checkpoint_key('rp2', token, repeat('€', 342)) FROM idempotency.claim_key('rp2') c$$, 'ERROR 22001', 'a recovery point of 342 characters, 1026 bytes'),
    (9, $$SELECT status FROM idempotency.complete_key('resp-max', (idempotency.claim_key('resp-max')).token, to_jsonb(repeat('x', 1048564)))$$, 'replay', 'a response of exactly 1 MB (idempotency.max_response_size)'),
    (10, $$SELECT pg_column_size(response) >= 1000000 FROM idempotency.claim_key('resp-max')$$, 'true', 'that response is stored and replayed'),
    (11, $$SELECT status FROM idempotency.complete_key('resp-over', (idempotency.claim_key('resp-over')).token, to_jsonb(repeat('x', 1048565)))$$, 'ERROR 54000', 'a response one byte over 1 MB'),
    (12, $$SELECT status FROM idempotency.complete_key('resp-big', (idempotency.claim_key('resp-big')).token, to_jsonb(repeat('x', 100 * 1024 * 1024)))$$, 'ERROR 54000', 'a 100 MB response'),
    (13, $$SELECT status FROM idempotency.claim_key(repeat('k', 256))$$, 'ERROR 22001', 'a key over idempotency.max_key_length (255)'),
    (14, $$SELECT status FROM idempotency.claim_key('k', NULL, repeat('s', 256))$$, 'ERROR 22001', 'a scope over idempotency.max_key_length'),
    (15, $$SELECT status FROM idempotency.claim_key(NULL)$$, 'ERROR 22004', 'a NULL key'),
    (16, $$SELECT status FROM idempotency.claim_key('k', NULL, NULL)$$, 'ERROR 22004', 'a NULL scope'),
    (17, $$SELECT status FROM idempotency.claim_key('')$$, 'ERROR 22023', 'an empty key'),
    (18, $$SELECT status FROM idempotency.claim_key('k', wait => '-1 second')$$, 'ERROR 22023', 'a negative wait')
  ) AS t(n, sql, expected, what)
 ORDER BY n;
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys WHERE owner = 'sec_alice'), :alice_rows_before + 3,
          'unbounded: only the accepted claims were stored (fp-64, rp, resp-max)');
SELECT is(sectest.row_of('sec_alice', '', 'rp'), 'processing attempts=1 token=t rp=' || repeat('€', 341) || 'z code=<NULL> response=<NULL>',
          'unbounded: the refused recovery points changed nothing');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys
            WHERE owner = 'sec_alice' AND (key LIKE 'big-%' OR key IN ('fp-65', 'rp2', 'resp-over', 'resp-big'))), 0,
          'unbounded: nothing of a refused call was stored');

-- Least privilege: without USAGE on the schema nothing is reachable.
SELECT is(sectest.state_as('sec_nousage', cmd), '42501', 'least privilege: without the grant: ' || cmd)
  FROM (VALUES
    (1, $$SELECT idempotency.claim_key('k')$$),
    (2, $$SELECT idempotency.complete_key('k', gen_random_uuid(), '{}')$$),
    (3, $$SELECT idempotency.release_key('k', gen_random_uuid())$$),
    (4, $$SELECT idempotency.checkpoint_key('k', gen_random_uuid(), 'x')$$),
    (5, $$SELECT idempotency.request_fingerprint('{}'::jsonb)$$),
    (6, $$SELECT idempotency.gen_uuid_v7()$$),
    (7, $$SELECT idempotency.idempotency_cleanup()$$),
    (8, $$SELECT * FROM idempotency.idempotency_stats$$),
    (9, $$SELECT * FROM idempotency.idempotency_keys$$),
    (10, $$SELECT 'idempotency.claim_key'::regproc$$)
  ) AS t(n, cmd)
 ORDER BY n;
-- With the grant, an application role still reaches the rows only through the functions.
SELECT is(sectest.state_as('sec_alice', cmd), '42501', 'least privilege: an application role cannot: ' || cmd)
  FROM (VALUES
    (1, $$SELECT * FROM idempotency.idempotency_keys$$),
    (2, $$INSERT INTO idempotency.idempotency_keys (owner, key, ttl, lease, created_at, expires_at, updated_at) VALUES ('sec_bob', 'k', '1 day', '1 hour', now(), now() + '1 day', now())$$),
    (3, $$UPDATE idempotency.idempotency_keys SET response = '{}'$$),
    (4, $$DELETE FROM idempotency.idempotency_keys$$),
    (5, $$SELECT * FROM idempotency.key_lock_salt$$),
    (6, $$SELECT idempotency.idempotency_cleanup()$$),
    (7, $$SELECT * FROM idempotency.idempotency_stats$$),
    (8, $$SELECT * FROM idempotency.idempotency_stats_rows()$$)
  ) AS t(n, cmd)
 ORDER BY n;
SELECT is((SELECT count(*)::int FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND prosecdef), 0,
          'least privilege: no function of the extension is SECURITY DEFINER');
SELECT ok(NOT has_schema_privilege('public', 'idempotency', 'USAGE'), 'least privilege: PUBLIC has no USAGE on schema idempotency');
SELECT is((SELECT string_agg(rolname, ', ') FROM pg_roles
            WHERE NOT rolsuper AND has_schema_privilege(oid, 'idempotency', 'CREATE')), NULL,
          'least privilege: no role but superusers may create objects in schema idempotency');
SELECT is((SELECT string_agg(format('%s owned by %s', o.what, r.rolname), ', ')
             FROM (SELECT 'schema ' || nspname AS what, nspowner AS owner FROM pg_namespace WHERE nspname = 'idempotency'
                   UNION ALL SELECT 'relation ' || relname, relowner FROM pg_class WHERE relnamespace = 'idempotency'::regnamespace
                   UNION ALL SELECT 'function ' || proname, proowner FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace
                   UNION ALL SELECT 'type ' || typname, typowner FROM pg_type WHERE typnamespace = 'idempotency'::regnamespace) o
             JOIN pg_roles r ON r.oid = o.owner
            WHERE NOT r.rolsuper), NULL,
          'least privilege: superusers own the schema and every object in it');

-------------------------------------------------------------------------------
-- 7. Key length at the ceiling, and keys of dropped roles (issue #11, attack 7).
-------------------------------------------------------------------------------
SET idempotency.max_key_length = 1024;
-- Random (incompressible) multibyte text: 512 two-byte letters, 341 three-byte ones + 'z'.
SELECT string_agg(chr(1040 + (random() * 63)::int), '') AS long_key FROM generate_series(1, 512) \gset
SELECT string_agg(chr(19968 + (random() * 20000)::int), '') || 'z' AS long_scope FROM generate_series(1, 341) \gset
SELECT is(octet_length(:'long_key') || ' ' || octet_length(:'long_scope'), '1024 1024', 'key length: a 1024-byte key and scope');
SELECT is(sectest.value_as('sec_alice', format($$INSERT INTO sectest.tokens SELECT 'long', token FROM idempotency.claim_key(%L, NULL, %L)
            WHERE status = 'claimed' RETURNING 'claimed'$$, :'long_key', :'long_scope')),
          'claimed', 'key length: key and scope at max_key_length 1024 (multibyte) are claimed, no index row size error');
SELECT is(sectest.value_as('sec_alice', format($$SELECT status FROM idempotency.complete_key(%L, (SELECT token FROM sectest.tokens WHERE name = 'long'), '{"long": true}', NULL, %L)$$,
            :'long_key', :'long_scope')), 'replay', 'key length: and completed');
SELECT is(sectest.value_as('sec_alice', format($$SELECT status || ' ' || response::text FROM idempotency.claim_key(%L, NULL, %L)$$, :'long_key', :'long_scope')),
          'replay {"long": true}', 'key length: the long key is found again and replays');
SELECT is(sectest.value_as('sec_alice', format($$SELECT status FROM idempotency.claim_key(%L, NULL, %L)$$, :'long_key' || 'x', :'long_scope')),
          'ERROR 22001', 'key length: a 1025-byte key answers 22001');
SELECT is(sectest.value_as('sec_alice', format($$SELECT status FROM idempotency.claim_key(%L, NULL, %L)$$, :'long_key', :'long_scope' || 'x')),
          'ERROR 22001', 'key length: a 1025-byte scope answers 22001');
RESET idempotency.max_key_length;
SELECT is(sectest.state('SET idempotency.max_key_length = 8192'), '22023', 'key length: max_key_length cannot be set to 8192');
SELECT is(sectest.state('SET idempotency.max_key_length = 1025'), '22023', 'key length: max_key_length cannot exceed 1024');

-- DROP ROLE of a role that owns keys: allowed; the next cleanup deletes its keys.
SELECT is(sectest.value_as('sec_gone', $$SELECT count(*) FROM (
            SELECT idempotency.claim_key('gone-open', NULL, 'gone', NULL, '1 hour')
            UNION ALL SELECT idempotency.complete_key('gone-done', (idempotency.claim_key('gone-done', NULL, 'gone')).token, '{"gone": true}', NULL, 'gone')
            UNION ALL SELECT idempotency.claim_key('gone-released', NULL, 'gone')) s$$),
          '3', 'dropped role: it owns three keys');
SELECT count(*) AS others_before FROM idempotency.idempotency_keys WHERE owner <> 'sec_gone' \gset
REVOKE USAGE ON SCHEMA idempotency FROM sec_gone;
SELECT lives_ok('DROP ROLE sec_gone', 'dropped role: DROP ROLE succeeds although the role owns keys');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys WHERE owner = 'sec_gone'), 3,
          'dropped role: its keys stay until the cleanup');
SELECT cmp_ok(idempotency.idempotency_cleanup(), '>=', 3::bigint, 'dropped role: idempotency_cleanup() deletes them');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys WHERE owner = 'sec_gone'), 0,
          'dropped role: none of its keys is left');
SELECT is((SELECT count(*) FROM idempotency.idempotency_keys WHERE owner <> 'sec_gone'), :others_before::bigint,
          'dropped role: the keys of existing roles are kept');

-------------------------------------------------------------------------------
-- 8. The switch to the extension owner is undone on every exit: after an error caught
--    by a savepoint, a cancel, an error outside a transaction block, an error caught in
--    PL/pgSQL, and a success, current_user and search_path are the caller's, and a
--    temporary table can be created (which a leftover security-restricted operation
--    would forbid).
-------------------------------------------------------------------------------
SELECT is(sectest.value_as('sec_alice', $$SELECT status FROM idempotency.claim_key('held', NULL, 'sw', NULL, '1 hour')$$),
          'claimed', 'switch: alice holds a key with a live lease');
SET ROLE sec_alice;
SET search_path = sec_alice_marker, public;
-- (a) an error inside the owner's context (P0002), rolled back to a savepoint
BEGIN;
SAVEPOINT before_error;
\set ON_ERROR_STOP 0
SELECT idempotency.complete_key('no-such-key', '018f0000-0000-7000-8000-000000000000', '{}');
\set ON_ERROR_STOP 1
ROLLBACK TO SAVEPOINT before_error;
SELECT current_user AS sw_a_user, current_setting('search_path') AS sw_a_path,
       sectest.state('CREATE TEMP TABLE sw_a (x int)') AS sw_a_temp \gset
COMMIT;
-- (b) a cancel while claim_key waits (as the owner) for the live lease
SET statement_timeout = '300ms';
BEGIN;
SAVEPOINT before_cancel;
\set ON_ERROR_STOP 0
SELECT idempotency.claim_key('held', NULL, 'sw', NULL, NULL, '10 seconds');
\set ON_ERROR_STOP 1
ROLLBACK TO SAVEPOINT before_cancel;
RESET statement_timeout;
SELECT current_user AS sw_b_user, current_setting('search_path') AS sw_b_path,
       sectest.state('CREATE TEMP TABLE sw_b (x int)') AS sw_b_temp \gset
COMMIT;
-- (c) an error outside a transaction block
\set ON_ERROR_STOP 0
SELECT idempotency.release_key('no-such-key', '018f0000-0000-7000-8000-000000000000');
\set ON_ERROR_STOP 1
SELECT current_user AS sw_c_user, current_setting('search_path') AS sw_c_path,
       sectest.state('CREATE TEMP TABLE sw_c (x int)') AS sw_c_temp \gset
-- (d) an error caught in PL/pgSQL, then checked in the same transaction
SELECT sectest.state($$SELECT idempotency.checkpoint_key('no-such-key', '018f0000-0000-7000-8000-000000000000', 'x')$$) AS sw_d_state,
       current_user AS sw_d_user, current_setting('search_path') AS sw_d_path,
       sectest.state('CREATE TEMP TABLE sw_d (x int)') AS sw_d_temp \gset
-- (e) a success
SELECT (idempotency.claim_key('switch-ok', NULL, 'sw')).status AS sw_e_status,
       current_user AS sw_e_user, current_setting('search_path') AS sw_e_path,
       sectest.state('CREATE TEMP TABLE sw_e (x int)') AS sw_e_temp \gset
RESET search_path;
RESET ROLE;
SELECT is(:'sw_a_user' || ' | ' || :'sw_a_path' || ' | ' || :'sw_a_temp', 'sec_alice | sec_alice_marker, public | 00000',
          'switch: after an error rolled back to a savepoint, the caller''s role, search_path and rights are back');
SELECT is(:'sw_b_user' || ' | ' || :'sw_b_path' || ' | ' || :'sw_b_temp', 'sec_alice | sec_alice_marker, public | 00000',
          'switch: after a cancel during a wait, the same');
SELECT is(:'sw_c_user' || ' | ' || :'sw_c_path' || ' | ' || :'sw_c_temp', 'sec_alice | sec_alice_marker, public | 00000',
          'switch: after an error outside a transaction block, the same');
SELECT is(:'sw_d_state' || ' | ' || :'sw_d_user' || ' | ' || :'sw_d_path' || ' | ' || :'sw_d_temp',
          'P0002 | sec_alice | sec_alice_marker, public | 00000',
          'switch: after an error caught in PL/pgSQL, the same');
SELECT is(:'sw_e_status' || ' | ' || :'sw_e_user' || ' | ' || :'sw_e_path' || ' | ' || :'sw_e_temp',
          'claimed | sec_alice | sec_alice_marker, public | 00000',
          'switch: after a successful call, the same');

-- A superuser's probe trigger on the real table, which used to record what the table work
-- runs as (test/t/030_security_worker.pl shows it now, through pg_stat_statements): since
-- 1.2 no code may run on the table (issue #20 item 1), so the call refuses before the switch.
CREATE TABLE sectest.probe (op text, who name, restricted text, path text);
CREATE FUNCTION sectest.probe() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE restricted text := 'not restricted';
BEGIN
  BEGIN
    CREATE TEMP TABLE sec_probe_temp (x int);
    DROP TABLE sec_probe_temp;
  EXCEPTION WHEN insufficient_privilege THEN
    restricted := 'restricted';
  END;
  INSERT INTO sectest.probe VALUES (TG_OP, current_user, restricted, current_setting('search_path'));
  RETURN NULL;
END $$;
CREATE TRIGGER sec_probe AFTER INSERT OR UPDATE ON idempotency.idempotency_keys
  FOR EACH ROW EXECUTE FUNCTION sectest.probe();
SELECT is(sectest.value_as('sec_alice', $$SELECT status FROM idempotency.complete_key('probe',
            (idempotency.claim_key('probe', NULL, 'sw')).token, '{}', NULL, 'sw')$$), 'ERROR 42501',
          'switch: with a probe trigger on the table, alice''s claim refuses (42501)');
DROP TRIGGER sec_probe ON idempotency.idempotency_keys;
SELECT is((SELECT count(*)::int FROM sectest.probe), 0, 'switch: the probe trigger never ran');

-------------------------------------------------------------------------------
-- 8b. A right on the extension's tables granted to an untrusted role (by a superuser's
-- GRANT, or the installing role's default privileges) makes every call refuse: TRIGGER
-- there would run that role's code as the owner, SELECT would read everyone's keys.
-------------------------------------------------------------------------------
GRANT TRIGGER ON idempotency.idempotency_keys TO sec_mallory;
SELECT is(sectest.state_as('sec_alice', $$SELECT idempotency.claim_key('grant-1')$$), '42501',
          'grants: a right of mallory on idempotency_keys makes claim_key refuse (42501)');
REVOKE ALL ON idempotency.idempotency_keys FROM sec_mallory;
GRANT SELECT ON idempotency.key_lock_salt TO PUBLIC;
SELECT is(sectest.state_as('sec_alice', $$SELECT idempotency.claim_key('grant-1')$$), '42501',
          'grants: the salt readable by PUBLIC makes claim_key refuse (42501)');
REVOKE ALL ON idempotency.key_lock_salt FROM PUBLIC;
SELECT is(sectest.value_as('sec_alice', $$SELECT status FROM idempotency.claim_key('grant-1')$$), 'claimed',
          'grants: revoked again, claims work');

-------------------------------------------------------------------------------
-- 8c. The extension's schema or table owned by a role that is not a superuser (only a
-- superuser can hand them over, say by a mistaken ALTER ... OWNER): that role could shape
-- what the table work runs as the owner, so every call refuses and names the owner, and
-- nothing is written (issue #16: these two checks of caller.cpp had no test).
-------------------------------------------------------------------------------
SELECT count(*) AS rows_before_owner_checks FROM idempotency.idempotency_keys \gset
ALTER SCHEMA idempotency OWNER TO sec_dbowner;
SELECT is(sectest.error_as('sec_alice', $$SELECT idempotency.claim_key('owner-1')$$),
          '42501 | schema "idempotency" of extension idempotency is owned by role "sec_dbowner", which is not a superuser'
          ' | Only superusers may own the extension''s schema and table; see SECURITY.md.',
          'owners: a schema owned by a non-superuser makes claim_key refuse (42501)');
ALTER SCHEMA idempotency OWNER TO postgres;
ALTER TABLE idempotency.idempotency_keys OWNER TO sec_dbowner;
SELECT is(sectest.error_as('sec_alice', $$SELECT idempotency.claim_key('owner-1')$$),
          '42501 | table idempotency_keys of extension idempotency is owned by role "sec_dbowner", which is not a superuser'
          ' | Only superusers may own the extension''s schema and table; see SECURITY.md.',
          'owners: a table owned by a non-superuser makes claim_key refuse (42501)');
SELECT is(sectest.state('SELECT idempotency.idempotency_cleanup()'), '42501',
          'owners: and idempotency_cleanup, even for a superuser');
ALTER TABLE idempotency.idempotency_keys OWNER TO postgres;
SELECT is((SELECT count(*) FROM idempotency.idempotency_keys), :rows_before_owner_checks::bigint,
          'owners: the refused calls wrote nothing');
SELECT is(sectest.value_as('sec_alice', $$SELECT status FROM idempotency.claim_key('owner-1')$$), 'claimed',
          'owners: owned by the superuser again, claims work');

-------------------------------------------------------------------------------
-- 8c. The batch functions (1.1) keep the same promises: keys of the caller only, no
-- refusal skipped inside a security-restricted operation, the same limits, no oracle.
-------------------------------------------------------------------------------
SELECT is(sectest.value_as('sec_alice', $$SELECT string_agg(status::text, ',' ORDER BY ordinality)
            FROM idempotency.claim_keys(ARRAY['batch-1', 'batch-2'], NULL, 'batch')$$), 'claimed,claimed',
          'batch: alice claims two keys');
SELECT is(sectest.value_as('sec_bob', $$SELECT string_agg(status::text, ',' ORDER BY ordinality)
            FROM idempotency.claim_keys(ARRAY['batch-1', 'batch-2'], NULL, 'batch')$$), 'claimed,claimed',
          'batch: bob''s batch of the same keys claims his own keys (no in_progress, nothing of alice''s)');
SELECT is(sectest.state_as('sec_bob', format($$SELECT * FROM idempotency.complete_keys(ARRAY['batch-1'], ARRAY[%L]::uuid[], ARRAY['{}']::jsonb[], NULL, 'batch')$$,
            (SELECT lease_token FROM idempotency.idempotency_keys k JOIN pg_roles r ON r.rolname = k.owner
              WHERE r.rolname = 'sec_alice' AND key = 'batch-1'))),
          '55000', 'batch: bob completing with alice''s token meets only his own key (fenced, 55000)');
SELECT is(sectest.state_as('sec_bob', $$SELECT * FROM idempotency.claim_keys(ARRAY['batch-3'], NULL, 'batch', NULL, '200000 years')$$),
          '22023', 'batch: the lease limit holds (22023)');
SELECT is(sectest.state_as('sec_bob', $$SELECT * FROM idempotency.claim_keys(ARRAY['batch-4'], ARRAY[pg_catalog.repeat('x', 100)::bytea], 'batch')$$),
          '22001', 'batch: the fingerprint limit holds (22001)');
CREATE MATERIALIZED VIEW sectest.mv_batch AS SELECT 1 AS one WITH NO DATA;
CREATE OR REPLACE FUNCTION sectest.batch_in_matview() RETURNS int LANGUAGE sql AS
  $$ SELECT count(*)::int FROM idempotency.claim_keys(ARRAY['batch-mv']) $$;
DROP MATERIALIZED VIEW sectest.mv_batch;
CREATE MATERIALIZED VIEW sectest.mv_batch AS SELECT sectest.batch_in_matview() AS n WITH NO DATA;
SELECT throws_ok('REFRESH MATERIALIZED VIEW sectest.mv_batch', '42501', NULL,
                 'batch: claim_keys inside REFRESH MATERIALIZED VIEW (a security-restricted operation) fails with 42501');
SELECT is(sectest.state_as('sec_nousage', $$SELECT * FROM idempotency.claim_keys(ARRAY['x'])$$), '42501',
          'batch: a role without USAGE on the schema cannot call claim_keys');

-------------------------------------------------------------------------------
-- 9. Nothing changed the roles; the backend is the one that started.
-------------------------------------------------------------------------------
SELECT is(pg_temp.attributes(r), :plain_role, 'no escalation: ' || r || ' has the attributes it was created with')
  FROM unnest(ARRAY['sec_dbowner', 'sec_alice', 'sec_bob', 'sec_mallory', 'sec_nousage']) AS r;
SELECT is(pg_backend_pid(), :start_pid, 'no crash: the same backend ran the whole file');
SELECT CASE WHEN :server_log_start < 0
  THEN skip('no server log at ' || :'server_log' || ' (not run by test/run.sh)', 1)
  ELSE is((SELECT string_agg(line, E'\n') FROM regexp_split_to_table(
             pg_read_file(:'server_log', :server_log_start, (pg_stat_file(:'server_log')).size - :server_log_start), E'\n') AS line
            WHERE line ~ '(terminated by signal|was terminated|server process .* exited with exit code|database system is in recovery mode|PANIC)'),
          NULL, 'no crash: no process of the server died while this file ran (server log)')
  END;

DO $$ BEGIN EXECUTE format('ALTER DATABASE %I OWNER TO postgres', current_database()); END $$;
DROP OWNED BY sec_dbowner, sec_alice, sec_bob, sec_mallory, sec_nousage CASCADE;
DROP ROLE sec_dbowner, sec_alice, sec_bob, sec_mallory, sec_nousage;

SELECT * FROM finish();
