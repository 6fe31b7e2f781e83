-- pgTAP: the run-time checks of security round 3 (issue #20, SPEC §7). Every call of the
-- extension acts as its owner, a superuser, so it refuses (42501) an installation where that
-- could run code a non-superuser can influence:
--   1. code attached to idempotency_keys or key_lock_salt (triggers, rules, row-level
--      security, CHECK constraints, foreign keys, defaults, generated and identity columns,
--      columns of foreign types, computed indexes and statistics, inheritance), which would
--      run as the owner with the caller's temporary schema in reach;
--   2. a schema where a role that is not a superuser may create objects, or that holds an
--      object which is not the extension's, or an object of the extension that a
--      non-superuser owns or that is SECURITY DEFINER; and the event trigger refuses a
--      non-superuser's DDL in the schema (a look-alike there would run without any check);
--   3. rights on a column of the extension's tables;
-- and the settings of the round: idempotency.executor_path and the defaults are for
-- superusers to set, and a settable citus.version changes nothing.
-- Each refusal: 42501 with a message naming what is attached, nothing written, no role
-- changed. Run by test/run.sh in a fresh database (pgtap and idempotency created by postgres).
-- Edition: C++ only: the installation checks of an extension owned by a superuser (the portable edition has its own: portable_install).
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(103);

SELECT pg_backend_pid() AS start_pid \gset
SELECT current_setting('data_directory') || '/../server.log' AS server_log \gset
SELECT coalesce((pg_stat_file(:'server_log', true)).size, -1) AS server_log_start \gset

-------------------------------------------------------------------------------
-- 0. Roles and helpers
-------------------------------------------------------------------------------
CREATE ROLE sc_app;
CREATE ROLE sc_alice;
CREATE ROLE sc_dbowner;
CREATE ROLE sc_group;
CREATE ROLE sc_member;
CREATE ROLE sc_root SUPERUSER;
CREATE ROLE sc_root2 SUPERUSER;
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I OWNER TO sc_dbowner', current_database()); END $$;
GRANT USAGE ON SCHEMA idempotency TO sc_app, sc_alice, sc_dbowner, sc_member;
GRANT sc_group TO sc_member;
CREATE SCHEMA sc_own AUTHORIZATION sc_app;

CREATE SCHEMA sc;
GRANT USAGE ON SCHEMA sc TO PUBLIC;
-- 'ok <first column of the first row>' ('ok <null>' for a command that returns none) or
-- '<SQLSTATE> | <message>' of `sql`, as the current user.
CREATE FUNCTION sc.outcome(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE result text; state text; message text;
BEGIN
  IF sql ~* '^\s*(SELECT|WITH)' THEN
    EXECUTE sql INTO result;
  ELSE
    EXECUTE sql;
  END IF;
  RETURN 'ok ' || coalesce(result, '<null>');
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
  RETURN state || ' | ' || message;
END $$;
-- The same as `who` (SET ROLE around it).
CREATE FUNCTION sc.outcome_as(who name, sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE result text;
BEGIN
  EXECUTE format('SET ROLE %I', who);
  result := sc.outcome(sql);
  RESET ROLE;
  RETURN result;
END $$;
-- The attributes a role was created with; any change is an escalation.
CREATE FUNCTION sc.attributes(role name) RETURNS text LANGUAGE sql AS $$
  SELECT format('super=%s createrole=%s createdb=%s bypassrls=%s', rolsuper, rolcreaterole, rolcreatedb, rolbypassrls)
    FROM pg_roles WHERE rolname = role $$;
\set plain '''super=f createrole=f createdb=f bypassrls=f'''
-- Key locks (advisory locks in the key-lock space of src/key_lock.cpp) that the transaction
-- of `sql` holds after it: only the executor path takes one for a new key.
CREATE FUNCTION sc.key_locks_after(sql text) RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE sql;
  RETURN (SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'
                                          AND objsubid BETWEEN 7424 AND 7679);
END $$;
CREATE FUNCTION sc.rows() RETURNS bigint LANGUAGE sql AS $$ SELECT count(*) FROM idempotency.idempotency_keys $$;

-------------------------------------------------------------------------------
-- 1. citus.version set by any role is a placeholder, not Citus: the session stays on the
--    direct path (issue #20 item 10). First, before any claim in this backend (the answer
--    is looked up once per backend).
-------------------------------------------------------------------------------
SET ROLE sc_app;
SET citus.version = '13.2.2';
SELECT sc.key_locks_after($$SELECT idempotency.claim_key('citus-1')$$) AS citus_locks \gset
RESET citus.version;
RESET ROLE;
SELECT is(:citus_locks::bigint, 0::bigint,
          'citus.version set by an application role: a new key is still claimed on the direct path (no key lock)');

-------------------------------------------------------------------------------
-- 2. idempotency.executor_path: a superuser's switch.
-------------------------------------------------------------------------------
SELECT is(sc.outcome_as('sc_app', 'SET idempotency.executor_path = on'),
          '42501 | permission denied to set parameter "idempotency.executor_path"',
          'executor_path: an application role cannot set it');
SELECT is(sc.outcome_as('sc_dbowner', format('ALTER DATABASE %I SET idempotency.executor_path = on', current_database())),
          '42501 | permission denied to set parameter "idempotency.executor_path"',
          'executor_path: the database owner cannot set it for the database');
BEGIN;
SET LOCAL idempotency.executor_path = on;
SELECT is(sc.key_locks_after($$SELECT idempotency.claim_key('executor-1')$$), 1::bigint,
          'executor_path on (superuser): a new key is claimed through the executor, under its key lock');
SELECT is((SELECT status::text FROM idempotency.complete_key('executor-1',
             (SELECT lease_token FROM idempotency.idempotency_keys WHERE key = 'executor-1'), '{}')), 'replay',
          'executor_path on: and completed');
ROLLBACK;
SELECT is(sc.key_locks_after($$SELECT idempotency.claim_key('executor-2')$$), 0::bigint,
          'executor_path off again: the direct path, no key lock');

-------------------------------------------------------------------------------
-- 3. Defaults only a superuser sets (issue #20 item 9): the database owner cannot shorten
--    every role's keys (test/t/032_security_settings.pl: a superuser's ALTER ROLE ... SET).
-------------------------------------------------------------------------------
SELECT is(sc.outcome_as('sc_dbowner', format('ALTER DATABASE %I SET idempotency.default_ttl = ''1s''', current_database())),
          '42501 | permission denied to set parameter "idempotency.default_ttl"',
          'defaults: ALTER DATABASE ... SET idempotency.default_ttl by the database owner is refused');
SELECT is(sc.outcome_as('sc_dbowner', format('ALTER DATABASE %I SET idempotency.default_lease = ''1s''', current_database())),
          '42501 | permission denied to set parameter "idempotency.default_lease"',
          'defaults: and idempotency.default_lease');
SELECT is(sc.outcome_as('sc_app', $$SELECT set_config('idempotency.default_ttl', '1s', false)$$),
          '42501 | permission denied to set parameter "idempotency.default_ttl"',
          'defaults: an application role cannot set them in its session either');
SELECT is((SELECT count(*)::int FROM pg_db_role_setting WHERE array_to_string(setconfig, ',') LIKE '%idempotency.%'), 0,
          'defaults: no setting was stored');

-------------------------------------------------------------------------------
-- 4. The attack of issue #20 item 1: a superuser's audit trigger on the key table, whose
--    function has SET search_path = public (pg_temp is searched first for relations), and an
--    application role's TEMP TABLE audit_log with a trigger of its own that makes it a
--    superuser. The claim is refused before anything runs as the owner.
-------------------------------------------------------------------------------
CREATE TABLE public.audit_log (what text);
CREATE FUNCTION public.audit() RETURNS trigger LANGUAGE plpgsql SET search_path = public AS
  $$ BEGIN INSERT INTO audit_log VALUES (TG_OP || ' ' || NEW.key); RETURN NEW; END $$;
CREATE TRIGGER audit AFTER INSERT OR UPDATE ON idempotency.idempotency_keys
  FOR EACH ROW EXECUTE FUNCTION public.audit();
SELECT sc.rows() AS rows_before_attack \gset
SET ROLE sc_app;
CREATE TEMP TABLE audit_log (what text);
CREATE TEMP TABLE fired (who name);
CREATE FUNCTION pg_temp.escalate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO pg_temp.fired VALUES (current_user);
  BEGIN
    EXECUTE 'ALTER ROLE sc_app SUPERUSER';
  EXCEPTION WHEN insufficient_privilege THEN NULL;
  END;
  RETURN NULL;
END $$;
CREATE TRIGGER escalate AFTER INSERT ON pg_temp.audit_log FOR EACH ROW EXECUTE FUNCTION pg_temp.escalate();
-- Control: with search_path = public, audit_log is the temporary table, whose trigger fires.
SET search_path = public;
INSERT INTO audit_log VALUES ('control');
SELECT string_agg(who, ',') AS attack_control FROM pg_temp.fired \gset
DELETE FROM pg_temp.fired;
SELECT sc.outcome($$SELECT status FROM idempotency.claim_key('k2')$$) AS attack \gset
RESET search_path;
SELECT count(*) AS attack_fired FROM pg_temp.fired \gset
RESET ROLE;
SELECT is(:'attack_control'::text, 'sc_app', 'trigger attack (control): the temporary audit_log catches an unqualified INSERT INTO audit_log');
SELECT is(:'attack'::text, '42501 | table idempotency_keys of extension idempotency has trigger "audit"',
          'trigger attack: claim_key refuses (42501), naming the trigger');
SELECT is(:attack_fired::int, 0, 'trigger attack: the temporary table''s trigger never ran');
SELECT is((SELECT count(*)::int FROM public.audit_log), 0, 'trigger attack: the audit trigger never ran');
SELECT is(sc.rows(), :rows_before_attack::bigint, 'trigger attack: nothing was written');
SELECT is(sc.attributes('sc_app'), :plain, 'trigger attack: sc_app is not a superuser');
SELECT is(sc.outcome_as('sc_alice', $$SELECT idempotency.complete_key('k2', gen_random_uuid(), '{}')$$),
          '42501 | table idempotency_keys of extension idempotency has trigger "audit"',
          'trigger attack: every function refuses (complete_key)');
SELECT is(sc.outcome($$SELECT idempotency.idempotency_cleanup()$$),
          '42501 | table idempotency_keys of extension idempotency has trigger "audit"',
          'trigger attack: and idempotency_cleanup(), for a superuser too');
DROP TRIGGER audit ON idempotency.idempotency_keys;
SELECT is(sc.outcome_as('sc_app', $$SELECT status FROM idempotency.claim_key('k2')$$), 'ok claimed',
          'trigger attack: the trigger dropped, the claim works');
DROP TABLE pg_temp.audit_log, pg_temp.fired;

-------------------------------------------------------------------------------
-- 5. Each kind of code on the tables, one at a time (in a transaction rolled back at the
--    end): the claim refuses with 42501, naming it, and writes nothing.
-------------------------------------------------------------------------------
CREATE FUNCTION public.sc_value() RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;
CREATE FUNCTION public.sc_true(text) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT true $$;
CREATE FUNCTION public.sc_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE DOMAIN public.sc_domain AS text CHECK (public.sc_true(VALUE));
CREATE TYPE public.sc_enum AS ENUM ('a');
CREATE OPERATOR CLASS public.sc_text_ops FOR TYPE text USING btree AS
  OPERATOR 1 pg_catalog.<, OPERATOR 2 pg_catalog.<=, OPERATOR 3 pg_catalog.=, OPERATOR 4 pg_catalog.>=,
  OPERATOR 5 pg_catalog.>, FUNCTION 1 pg_catalog.bttextcmp(text, text);
CREATE TABLE public.sc_parent (key text COLLATE "C");
CREATE TABLE sc.cases (n int, ddl text, expected text);
INSERT INTO sc.cases VALUES
  (1, 'CREATE TRIGGER t BEFORE UPDATE ON idempotency.idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION public.sc_noop()',
      'table idempotency_keys of extension idempotency has trigger "t"'),
  (2, 'CREATE TRIGGER t AFTER DELETE ON idempotency.idempotency_keys FOR EACH ROW EXECUTE FUNCTION public.sc_noop(); ALTER TABLE idempotency.idempotency_keys DISABLE TRIGGER t',
      'table idempotency_keys of extension idempotency has trigger "t"'),
  (3, 'CREATE RULE r AS ON INSERT TO idempotency.idempotency_keys DO ALSO NOTIFY sc',
      'table idempotency_keys of extension idempotency has rule "r"'),
  (4, 'ALTER TABLE idempotency.idempotency_keys ENABLE ROW LEVEL SECURITY',
      'table idempotency_keys of extension idempotency has row-level security enabled'),
  (5, 'ALTER TABLE idempotency.idempotency_keys FORCE ROW LEVEL SECURITY',
      'table idempotency_keys of extension idempotency has row-level security enabled'),
  (6, 'CREATE POLICY p ON idempotency.idempotency_keys USING (public.sc_true(key))',
      'table idempotency_keys of extension idempotency has policy "p"'),
  (7, 'ALTER TABLE idempotency.idempotency_keys ADD CONSTRAINT c CHECK (public.sc_true(key)) NOT VALID',
      'table idempotency_keys of extension idempotency has check constraint "c"'),
  (8, 'CREATE TABLE public.sc_refs (owner text COLLATE "C", key text COLLATE "C", scope text COLLATE "C", FOREIGN KEY (key, scope, owner) REFERENCES idempotency.idempotency_keys (key, scope, owner) ON DELETE CASCADE)',
      'table idempotency_keys of extension idempotency takes part in foreign key constraint "sc_refs_key_scope_owner_fkey"'),
  (9, 'ALTER TABLE idempotency.idempotency_keys ALTER COLUMN recovery_point SET DEFAULT public.sc_value()',
      'column "recovery_point" of table idempotency_keys of extension idempotency has a default that the extension did not give it'),
  (10, 'ALTER TABLE idempotency.idempotency_keys ALTER COLUMN attempts SET DEFAULT 2',
      'column "attempts" of table idempotency_keys of extension idempotency has a default that the extension did not give it'),
  (11, 'ALTER TABLE idempotency.idempotency_keys ALTER COLUMN scope SET DEFAULT ''x''',
      'column "scope" of table idempotency_keys of extension idempotency has a default that the extension did not give it'),
  (12, 'ALTER TABLE idempotency.idempotency_keys ALTER COLUMN status SET DEFAULT ''completed''',
      'column "status" of table idempotency_keys of extension idempotency has a default that the extension did not give it'),
  (13, 'ALTER TABLE idempotency.idempotency_keys ADD COLUMN tenant text DEFAULT public.sc_value()',
      'column "tenant" of table idempotency_keys of extension idempotency has a default that the extension did not give it'),
  (14, 'ALTER TABLE idempotency.idempotency_keys ADD COLUMN tenant text DEFAULT ''acme''',
      'column "tenant" of table idempotency_keys of extension idempotency has a default that the extension did not give it'),
  (15, 'ALTER TABLE idempotency.idempotency_keys ADD COLUMN g text GENERATED ALWAYS AS (lower(key)) STORED',
      'column "g" of table idempotency_keys of extension idempotency is a generated column'),
  (16, 'ALTER TABLE idempotency.idempotency_keys ALTER COLUMN attempts DROP DEFAULT, ALTER COLUMN attempts ADD GENERATED BY DEFAULT AS IDENTITY',
      'column "attempts" of table idempotency_keys of extension idempotency is an identity column'),
  (17, 'ALTER TABLE idempotency.idempotency_keys ADD COLUMN d public.sc_domain',
      'column "d" of table idempotency_keys of extension idempotency is of type public.sc_domain, which is neither built in nor the extension''s'),
  (18, 'ALTER TABLE idempotency.idempotency_keys ADD COLUMN e public.sc_enum',
      'column "e" of table idempotency_keys of extension idempotency is of type public.sc_enum, which is neither built in nor the extension''s'),
  (19, 'CREATE INDEX x ON idempotency.idempotency_keys (lower(key))',
      'index "x" on table idempotency_keys of extension idempotency has expressions or a predicate'),
  (20, 'CREATE INDEX x ON idempotency.idempotency_keys (key) WHERE public.sc_true(key)',
      'index "x" on table idempotency_keys of extension idempotency has expressions or a predicate'),
  (21, 'CREATE INDEX x ON idempotency.idempotency_keys (key public.sc_text_ops)',
      'index "x" on table idempotency_keys of extension idempotency uses an access method or operator class that is not built in'),
  (22, 'CREATE STATISTICS public.s ON (lower(key)) FROM idempotency.idempotency_keys',
      'statistics object "s" on table idempotency_keys of extension idempotency has expressions (ANALYZE evaluates them as the table''s owner)'),
  (23, 'CREATE TABLE public.sc_child () INHERITS (idempotency.idempotency_keys)',
      'table idempotency_keys of extension idempotency has an inheritance parent or child (or is a partition)'),
  (24, 'ALTER TABLE idempotency.idempotency_keys INHERIT public.sc_parent',
      'table idempotency_keys of extension idempotency has an inheritance parent or child (or is a partition)'),
  (25, 'CREATE TRIGGER t BEFORE INSERT ON idempotency.key_lock_salt FOR EACH ROW EXECUTE FUNCTION public.sc_noop()',
      'table key_lock_salt of extension idempotency has trigger "t"'),
  (26, 'ALTER TABLE idempotency.key_lock_salt ENABLE ROW LEVEL SECURITY',
      'table key_lock_salt of extension idempotency has row-level security enabled'),
  (27, 'ALTER TABLE idempotency.key_lock_salt ALTER COLUMN salt SET DEFAULT ''\x00''',
      'column "salt" of table key_lock_salt of extension idempotency has a default that the extension did not give it'),
  (28, 'GRANT SELECT (response) ON idempotency.idempotency_keys TO sc_app',
      'column response of table idempotency_keys of extension idempotency grants rights to role "sc_app", which is not a superuser'),
  (29, 'GRANT SELECT (salt) ON idempotency.key_lock_salt TO PUBLIC',
      'column salt of table key_lock_salt of extension idempotency grants rights to PUBLIC, which is not a superuser'),
  (30, 'ALTER TABLE idempotency.idempotency_keys ALTER COLUMN scope SET DEFAULT public.sc_value()',
      'column "scope" of table idempotency_keys of extension idempotency has a default that the extension did not give it');
-- Each case in its own subtransaction, rolled back after the claim (its result kept).
CREATE TABLE sc.results (n int, outcome text, rows_written bigint, app text);
CREATE FUNCTION sc.try_case(c sc.cases) RETURNS void LANGUAGE plpgsql AS $$
DECLARE before bigint := sc.rows(); result text; written bigint; app text;
BEGIN
  BEGIN
    EXECUTE c.ddl;
    result := sc.outcome_as('sc_app', $q$SELECT status FROM idempotency.claim_key('attached-' || pg_backend_pid())$q$);
    written := sc.rows() - before;
    app := sc.attributes('sc_app');
    RAISE SQLSTATE 'PX001';
  EXCEPTION WHEN SQLSTATE 'PX001' THEN NULL;
  END;
  INSERT INTO sc.results VALUES (c.n, result, written, app);
END $$;
SELECT sc.try_case(c) FROM sc.cases c ORDER BY n;
SELECT is(r.outcome, '42501 | ' || c.expected, format('attached code %s: %s', c.n, c.ddl))
  FROM sc.cases c JOIN sc.results r USING (n) ORDER BY n;
SELECT is((SELECT string_agg(n::text, ',') FROM sc.results WHERE rows_written <> 0 OR app <> :plain), NULL,
          'attached code: no refused claim wrote a row or changed a role');

-- What stays allowed (sent to the executor where the direct path cannot write it).
CREATE TABLE sc.allowed (n int, ddl text);
INSERT INTO sc.allowed VALUES
  (1, 'CREATE TRIGGER t BEFORE TRUNCATE ON idempotency.idempotency_keys FOR EACH STATEMENT EXECUTE FUNCTION public.sc_noop()'),
  (2, 'ALTER TABLE idempotency.idempotency_keys ADD COLUMN tenant text'),
  (3, 'DELETE FROM idempotency.idempotency_keys; ALTER TABLE idempotency.idempotency_keys ALTER COLUMN recovery_point SET NOT NULL'),
  (4, 'ALTER TABLE idempotency.idempotency_keys ALTER COLUMN created_at TYPE timestamptz(3)'),
  (5, 'CREATE INDEX x ON idempotency.idempotency_keys (owner, created_at)'),
  (6, 'CREATE INDEX x ON idempotency.idempotency_keys USING hash (key)'),
  (7, 'CREATE STATISTICS public.s (dependencies) ON scope, key FROM idempotency.idempotency_keys'),
  (8, 'ALTER TABLE idempotency.idempotency_keys ADD COLUMN tenant text DEFAULT ''acme''; ALTER TABLE idempotency.idempotency_keys ALTER COLUMN tenant DROP DEFAULT');
CREATE TABLE sc.allowed_results (n int, outcome text);
CREATE FUNCTION sc.try_allowed(c sc.allowed) RETURNS void LANGUAGE plpgsql AS $$
DECLARE result text;
BEGIN
  BEGIN
    EXECUTE c.ddl;
    -- A NOT NULL on recovery_point: the claim is refused by that constraint, as the executor does.
    result := sc.outcome_as('sc_app', $q$SELECT status FROM idempotency.claim_key('allowed-' || pg_backend_pid())$q$);
    RAISE SQLSTATE 'PX001';
  EXCEPTION WHEN SQLSTATE 'PX001' THEN NULL;
  END;
  INSERT INTO sc.allowed_results VALUES (c.n, result);
END $$;
SELECT sc.try_allowed(c) FROM sc.allowed c ORDER BY n;
SELECT is(r.outcome, CASE WHEN c.n = 3 THEN '23502 | null value in column "recovery_point" of relation "idempotency_keys" violates not-null constraint'
                          ELSE 'ok claimed' END,
          format('allowed %s: %s', c.n, c.ddl))
  FROM sc.allowed c JOIN sc.allowed_results r USING (n) ORDER BY n;

-------------------------------------------------------------------------------
-- 6. CREATE on the extension's schema, granted later (issue #20 item 2): the attack, then
--    the other ways a role that is not a superuser may create objects there.
-------------------------------------------------------------------------------
SELECT sc.rows() AS rows_before_schema \gset
GRANT ALL ON SCHEMA idempotency TO sc_app;
SELECT is(sc.outcome_as(who, sql),
          '42501 | role "sc_app", which is not a superuser, may create objects in schema "idempotency" of extension idempotency',
          format('CREATE for sc_app: %s by %s refuses', sql, who))
  FROM (VALUES ('sc_alice', $$SELECT status FROM idempotency.claim_key('s-1')$$),
               ('postgres', $$SELECT status FROM idempotency.claim_key('s-1')$$),
               ('sc_app', $$SELECT status FROM idempotency.claim_key('s-1')$$)) AS t(who, sql);
-- sc_app plants a better match for untyped literals, which would make it a superuser.
CREATE TABLE sc.planted_log (who name);
GRANT INSERT ON sc.planted_log TO PUBLIC;
SELECT is(sc.outcome_as('sc_app', $q$CREATE FUNCTION idempotency.complete_key(key text, token text, response text)
            RETURNS text LANGUAGE plpgsql AS $f$
            BEGIN
              INSERT INTO sc.planted_log VALUES (current_user);
              EXECUTE 'ALTER ROLE sc_app SUPERUSER';
              RETURN 'planted';
            END $f$ $q$),
          '42501 | only superusers may create or change objects in schema "idempotency" of extension idempotency',
          'CREATE for sc_app: planting idempotency.complete_key(text, text, text) is refused by the event trigger');
SELECT is(sc.outcome_as('sc_app', $$CREATE FUNCTION sc_own.f() RETURNS int LANGUAGE sql AS 'SELECT 1'$$), 'ok <null>',
          'CREATE for sc_app: its DDL elsewhere is not refused');
SELECT is(sc.outcome_as('sc_app', $$ALTER FUNCTION sc_own.f() SET SCHEMA idempotency$$),
          '42501 | only superusers may create or change objects in schema "idempotency" of extension idempotency',
          'CREATE for sc_app: ALTER FUNCTION ... SET SCHEMA idempotency is refused too');
SELECT is(sc.outcome_as(who, $$SELECT idempotency.complete_key('s-1', '018f0000-0000-7000-8000-000000000000', '{}')::text$$),
          '42501 | role "sc_app", which is not a superuser, may create objects in schema "idempotency" of extension idempotency',
          format('CREATE for sc_app: complete_key with untyped literals by %s reaches the extension, which refuses', who))
  FROM unnest(ARRAY['sc_alice', 'postgres']) AS who;
SELECT is((SELECT count(*)::int FROM sc.planted_log), 0, 'CREATE for sc_app: the planted function never ran');
SELECT is(sc.attributes('sc_app'), :plain, 'CREATE for sc_app: sc_app is not a superuser');

-- The event trigger disabled (a superuser's choice): the run-time check still refuses, and
-- names the look-alike once the privilege is gone.
ALTER EVENT TRIGGER idempotency_guard_schema DISABLE;
SELECT is(sc.outcome_as('sc_app', $q$CREATE FUNCTION idempotency.complete_key(key text, token text, response text)
            RETURNS text LANGUAGE sql AS $f$ SELECT 'planted' $f$ $q$), 'ok <null>',
          'event trigger disabled: sc_app plants idempotency.complete_key(text, text, text)');
ALTER EVENT TRIGGER idempotency_guard_schema ENABLE;
REVOKE ALL ON SCHEMA idempotency FROM sc_app;
GRANT USAGE ON SCHEMA idempotency TO sc_app;
SELECT is(sc.outcome_as('sc_alice', $$SELECT status FROM idempotency.claim_key('s-1')$$),
          '42501 | function idempotency.complete_key(pg_catalog.text,pg_catalog.text,pg_catalog.text) is in schema "idempotency" but not part of extension idempotency',
          'a look-alike left in the schema: every call refuses, naming it');
SELECT is(sc.outcome_as('sc_app', $$DROP FUNCTION idempotency.complete_key(text, text, text)$$), 'ok <null>',
          'its owner may still drop it');
SELECT is(sc.outcome_as('sc_alice', $$SELECT status FROM idempotency.claim_key('s-1')$$), 'ok claimed',
          'then the calls work again');

-- Other holders of CREATE.
GRANT CREATE ON SCHEMA idempotency TO PUBLIC;
SELECT is(sc.outcome_as('sc_alice', $$SELECT status FROM idempotency.claim_key('s-2')$$),
          '42501 | PUBLIC may create objects in schema "idempotency" of extension idempotency',
          'CREATE for PUBLIC: refused, naming PUBLIC');
REVOKE CREATE ON SCHEMA idempotency FROM PUBLIC;
GRANT CREATE ON SCHEMA idempotency TO sc_group;
SELECT is(sc.outcome_as('sc_alice', $$SELECT status FROM idempotency.claim_key('s-2')$$),
          '42501 | role "sc_group", which is not a superuser, may create objects in schema "idempotency" of extension idempotency',
          'CREATE for a group role that sc_member belongs to: refused, naming the group');
REVOKE CREATE ON SCHEMA idempotency FROM sc_group;
GRANT CREATE ON SCHEMA idempotency TO sc_root;
SELECT is(sc.outcome_as('sc_alice', $$SELECT status FROM idempotency.claim_key('s-2')$$), 'ok claimed',
          'CREATE for a superuser role without members: allowed');
GRANT sc_root TO sc_member;
SELECT is(sc.outcome_as('sc_alice', $$SELECT status FROM idempotency.claim_key('s-3')$$),
          '42501 | role "sc_member", which is not a superuser, may create objects in schema "idempotency" of extension idempotency',
          'CREATE through membership in that superuser role: refused, naming the member (as has_schema_privilege sees it)');
REVOKE sc_root FROM sc_member;
REVOKE CREATE ON SCHEMA idempotency FROM sc_root;
SELECT is(sc.rows() - :rows_before_schema, 2::bigint, 'CREATE holders: only the two accepted claims were written');

-- Objects a superuser put into the schema, and objects of the extension changed.
CREATE TABLE sc.strays (n int, ddl text, expected text, undo text);
INSERT INTO sc.strays VALUES
  (1, 'CREATE FUNCTION idempotency.helper() RETURNS int LANGUAGE sql AS ''SELECT 1''',
      'function idempotency.helper() is in schema "idempotency" but not part of extension idempotency',
      'DROP FUNCTION idempotency.helper()'),
  (2, 'CREATE TABLE idempotency.notes (x int)',
      'table idempotency.notes is in schema "idempotency" but not part of extension idempotency', 'DROP TABLE idempotency.notes'),
  (3, 'CREATE VIEW idempotency.v AS SELECT 1 AS one', 'view idempotency.v is in schema "idempotency" but not part of extension idempotency',
      'DROP VIEW idempotency.v'),
  (4, 'CREATE TYPE idempotency.claim_result2 AS (status text)',
      'type idempotency.claim_result2 is in schema "idempotency" but not part of extension idempotency', 'DROP TYPE idempotency.claim_result2'),
  (5, 'CREATE OPERATOR idempotency.=== (LEFTARG = text, RIGHTARG = text, FUNCTION = pg_catalog.texteq)',
      'operator idempotency.===(pg_catalog.text,pg_catalog.text) is in schema "idempotency" but not part of extension idempotency',
      'DROP OPERATOR idempotency.=== (text, text)'),
  (6, 'CREATE SEQUENCE idempotency.s', 'sequence idempotency.s is in schema "idempotency" but not part of extension idempotency',
      'DROP SEQUENCE idempotency.s'),
  (7, 'CREATE TABLE public.sc_moved (x int); ALTER TABLE public.sc_moved SET SCHEMA idempotency',
      'table idempotency.sc_moved is in schema "idempotency" but not part of extension idempotency', 'DROP TABLE idempotency.sc_moved'),
  (8, 'ALTER FUNCTION public.sc_value() SET SCHEMA idempotency',
      'function idempotency.sc_value() is in schema "idempotency" but not part of extension idempotency',
      'ALTER FUNCTION idempotency.sc_value() SET SCHEMA public'),
  (9, 'ALTER FUNCTION idempotency.gen_uuid_v7() OWNER TO sc_app',
      'function idempotency.gen_uuid_v7() of extension idempotency is owned by role "sc_app", which is not a superuser',
      'ALTER FUNCTION idempotency.gen_uuid_v7() OWNER TO postgres'),
  (10, 'ALTER TYPE idempotency.claim_result OWNER TO sc_app',
      'type idempotency.claim_result of extension idempotency is owned by role "sc_app", which is not a superuser',
      'ALTER TYPE idempotency.claim_result OWNER TO postgres'),
  (11, 'ALTER TABLE idempotency.key_lock_salt OWNER TO sc_app',
      'table key_lock_salt of extension idempotency is owned by role "sc_app", which is not a superuser',
      'ALTER TABLE idempotency.key_lock_salt OWNER TO postgres'),
  (12, 'ALTER VIEW idempotency.idempotency_stats OWNER TO sc_app',
      'view idempotency.idempotency_stats of extension idempotency is owned by role "sc_app", which is not a superuser',
      'ALTER VIEW idempotency.idempotency_stats OWNER TO postgres'),
  (13, 'ALTER FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval) SECURITY DEFINER',
      'function idempotency.claim_key(pg_catalog.text,pg_catalog.bytea,pg_catalog.text,interval,interval,interval) of extension idempotency is SECURITY DEFINER',
      'ALTER FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval) SECURITY INVOKER');
CREATE TABLE sc.stray_results (n int, outcome text, after_undo text);
CREATE FUNCTION sc.try_stray(c sc.strays) RETURNS void LANGUAGE plpgsql AS $$
DECLARE result text; after text;
BEGIN
  EXECUTE c.ddl;
  result := sc.outcome_as('sc_alice', $q$SELECT status FROM idempotency.claim_key('stray-' || pg_backend_pid())$q$);
  EXECUTE c.undo;
  after := sc.outcome_as('sc_alice', $q$SELECT status FROM idempotency.claim_key('stray-' || pg_backend_pid(), wait => '0')$q$);
  INSERT INTO sc.stray_results VALUES (c.n, result, after);
END $$;
SELECT sc.rows() AS rows_before_strays \gset
SELECT sc.try_stray(c) FROM sc.strays c ORDER BY n;
SELECT is(r.outcome, '42501 | ' || c.expected, format('schema object %s: %s', c.n, c.ddl))
  FROM sc.strays c JOIN sc.stray_results r USING (n) ORDER BY n;
SELECT is((SELECT string_agg(n::text || ' ' || after_undo, ', ') FROM sc.stray_results
            WHERE after_undo NOT IN ('ok claimed', 'ok in_progress')), NULL,
          'schema objects: each one undone, calls work again');
SELECT is(sc.rows() - :rows_before_strays, 1::bigint, 'schema objects: only the accepted claim was written');

-- The extension's C function declared by a superuser in a schema of its own (safe by itself:
-- owned by a superuser, CREATE for nobody else): its calls refuse, since the extension's
-- tables are not in that schema, and write nothing.
CREATE SCHEMA sc_copy;
CREATE FUNCTION sc_copy.claim_key(key text, fingerprint bytea DEFAULT NULL, scope text DEFAULT '',
                                  ttl interval DEFAULT NULL, lease interval DEFAULT NULL, wait interval DEFAULT NULL)
  RETURNS idempotency.claim_result LANGUAGE c AS '$libdir/idempotency', 'claim_key';
SELECT is(sc.outcome($$SELECT status FROM sc_copy.claim_key('copy-1')$$) || ' ' ||
            (SELECT count(*) FROM idempotency.idempotency_keys WHERE key = 'copy-1'),
          '42704 | extension idempotency is not installed in schema "sc_copy" 0',
          'the extension''s function declared in another schema: refused (42704), nothing written');
DROP SCHEMA sc_copy CASCADE;

-------------------------------------------------------------------------------
-- 7. Event triggers of a superuser never fire during the extension's calls (it runs no
--    DDL), so their code does not run as the owner either.
-------------------------------------------------------------------------------
CREATE TABLE sc.event_log (event text, tag text);
CREATE FUNCTION sc.log_event() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO sc.event_log VALUES (TG_EVENT, TG_TAG); END $$;
CREATE EVENT TRIGGER sc_start ON ddl_command_start EXECUTE FUNCTION sc.log_event();
CREATE EVENT TRIGGER sc_end ON ddl_command_end EXECUTE FUNCTION sc.log_event();
CREATE EVENT TRIGGER sc_drop ON sql_drop EXECUTE FUNCTION sc.log_event();
CREATE EVENT TRIGGER sc_rewrite ON table_rewrite EXECUTE FUNCTION sc.log_event();
DELETE FROM sc.event_log;
SELECT is(sc.outcome_as('sc_app', $$SELECT count(*) FROM (
            SELECT 1 FROM idempotency.complete_key('ev-1', (idempotency.claim_key('ev-1')).token, '{}')
            UNION ALL SELECT 1 FROM (SELECT idempotency.checkpoint_key('ev-2', (idempotency.claim_key('ev-2')).token, 'x')) c
            UNION ALL SELECT 1 FROM (SELECT idempotency.release_key('ev-3', (SELECT token FROM idempotency.claim_key('ev-3')))) r
            UNION ALL SELECT 1 FROM idempotency.claim_keys(ARRAY['ev-4', 'ev-5'])
            UNION ALL SELECT 1 FROM idempotency.complete_keys(ARRAY['ev-6'], ARRAY[(idempotency.claim_key('ev-6')).token], ARRAY['{}'::jsonb])) s$$),
          'ok 6', 'event triggers: the calls of an application role run');
SELECT is(sc.outcome($$SELECT idempotency.idempotency_cleanup()$$), 'ok 0', 'event triggers: and the cleanup');
SELECT is((SELECT string_agg(event || ' ' || tag, ', ') FROM sc.event_log), NULL,
          'event triggers: none fired during the calls');
DROP EVENT TRIGGER sc_start;
DROP EVENT TRIGGER sc_end;
DROP EVENT TRIGGER sc_drop;
DROP EVENT TRIGGER sc_rewrite;

-------------------------------------------------------------------------------
-- 8. Nothing changed the roles; no crash.
-------------------------------------------------------------------------------
SELECT is(sc.attributes(r), :plain, 'no escalation: ' || r)
  FROM unnest(ARRAY['sc_app', 'sc_alice', 'sc_dbowner', 'sc_group', 'sc_member']) AS r;
SELECT is(pg_backend_pid(), :start_pid, 'no crash: the same backend ran the whole file');
SELECT CASE WHEN :server_log_start < 0
  THEN skip('no server log at ' || :'server_log' || ' (not run by test/run.sh)', 1)
  ELSE is((SELECT string_agg(line, E'\n') FROM regexp_split_to_table(
             pg_read_file(:'server_log', :server_log_start, (pg_stat_file(:'server_log')).size - :server_log_start), E'\n') AS line
            WHERE line ~ '(terminated by signal|was terminated|server process .* exited with exit code|database system is in recovery mode|PANIC)'),
          NULL, 'no crash: no process of the server died while this file ran (server log)')
  END;

DO $$ BEGIN EXECUTE format('ALTER DATABASE %I OWNER TO postgres', current_database()); END $$;
DROP OWNED BY sc_app, sc_alice, sc_dbowner, sc_group, sc_member, sc_root, sc_root2 CASCADE;
DROP ROLE sc_app, sc_alice, sc_dbowner, sc_group, sc_member, sc_root, sc_root2;

SELECT * FROM finish();
