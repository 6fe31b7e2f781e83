-- idempotency 1.1 -> 1.2: corners (security round 3, correctness, responses as sent).
-- ALTER EXTENSION idempotency UPDATE TO '1.2' runs this; CREATE EXTENSION of 1.2 runs
-- idempotency--1.0.sql, idempotency--1.0--1.1.sql and then this script, so a fresh install
-- and an upgraded one are made by the same statements.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.2'" to load this file. \quit

-------------------------------------------------------------------------------
-- The owner of a key is the role's name (section: owner)
-------------------------------------------------------------------------------

-- 1.0 and 1.1 stored the owner as a regrole, an OID: a row copied to another cluster or moved
-- to another Citus node (where the same role has another OID) named another role, or none.
-- From 1.2 the owner is the role's name, as pg_dump, COPY, logical replication and Citus carry
-- it. Keys of roles dropped before the update have no name to keep: the column change gives
-- them one that no role can have (64 bytes, one more than a role name takes), and they are
-- deleted.
-- The primary key becomes (key, scope, owner): descents compare the key first (read at a fixed
-- offset, as 1.1 did after its fixed-width owner), and the owner, now a name, comes last.
-- Each statement is run by EXECUTE: Citus passes a DDL statement on to the shards as its own
-- text (so each shard's OIDs are read on its own node), and refuses ADD CONSTRAINT beside
-- another subcommand. The deletion compares names only, so Citus pushes it down to the shards
-- whole (a subquery on pg_roles would run on the coordinator, with the coordinator's OIDs). A
-- Citus worker runs this script too, for its shell table, inside the coordinator's command:
-- there a query of the table would be a nested distributed one, and the coordinator's
-- deletion covers the worker's shards. The column change rewrites the table under its ACCESS
-- EXCLUSIVE lock (seconds per million keys).
DO $$
DECLARE
  citus_worker pg_catalog.bool := false;
BEGIN
  IF pg_catalog.to_regclass('pg_catalog.pg_dist_local_group') IS NOT NULL THEN
    EXECUTE 'SELECT groupid OPERATOR(pg_catalog.<>) 0 AND EXISTS (SELECT FROM pg_catalog.pg_dist_partition '
            'WHERE logicalrelid OPERATOR(pg_catalog.=) ''@extschema@.idempotency_keys''::pg_catalog.regclass) '
            'FROM pg_catalog.pg_dist_local_group'
       INTO citus_worker;
  END IF;
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys DROP CONSTRAINT idempotency_keys_pkey';
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ALTER COLUMN owner TYPE pg_catalog.text '
          'COLLATE pg_catalog."C" USING CASE WHEN pg_catalog.to_regrole(pg_catalog.quote_ident('
          'pg_catalog.pg_get_userbyid(owner::pg_catalog.oid)))::pg_catalog.oid '
          'OPERATOR(pg_catalog.=) owner::pg_catalog.oid '
          'THEN pg_catalog.pg_get_userbyid(owner::pg_catalog.oid)::pg_catalog.text '
          'ELSE pg_catalog.repeat(''?'', 64) END';
  IF NOT citus_worker THEN
    EXECUTE 'DELETE FROM @extschema@.idempotency_keys '
            'WHERE owner OPERATOR(pg_catalog.=) pg_catalog.repeat(''?'', 64)';
  END IF;
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys '
          'ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (key, scope, owner)';
END
$$;

COMMENT ON COLUMN @extschema@.idempotency_keys.owner IS
  'Name of the role that claimed the key (current_user at the call) and part of its identity: '
  'the key answers only a role of this name, wherever the row is copied or moved. Keys of '
  'dropped or renamed roles are deleted by the cleanup and left out of dumps.';

-- pg_dump leaves out keys whose owner names no role (a dropped or renamed role's).
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_keys',
  'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) owner)');

-------------------------------------------------------------------------------
-- Monitoring and statistics (section: monitoring)
-------------------------------------------------------------------------------

-- idempotency_cleanup() runs its deletions in a background worker of its own, each batch
-- committed there: the calling transaction holds no lock on any key, so it never blocks a
-- claim, however long it stays open.
COMMENT ON FUNCTION @extschema@.idempotency_cleanup(integer) IS
  'Deletes expired keys, and keys whose owner names no role, now; returns how many. The '
  'deletions run in a background worker of their own, in batches of batch_size (default '
  'idempotency.cleanup_batch_size), each committed there with SKIP LOCKED: the caller''s '
  'transaction holds no lock on any key, sees the keys gone, and cannot roll the deletions '
  'back; only committed keys are seen. Needs a free max_worker_processes slot (53400 when '
  'none is). Without shared_preload_libraries every call also reads the whole table for keys '
  'of dropped or renamed roles; with it, only after a role changed. Usable from pg_cron.';

-- The statistics gain four columns. They come after note, so that a library newer than its
-- installation still answers the 1.1 declaration; the view and its function are made again
-- (a view of the user's on top of idempotency_stats makes this update fail: drop it first).
DROP VIEW @extschema@.idempotency_stats;
DROP FUNCTION @extschema@.idempotency_stats_rows();

CREATE FUNCTION @extschema@.idempotency_stats_rows(
  OUT database oid, OUT shared_memory boolean,
  OUT claimed bigint, OUT reclaimed bigint, OUT replayed bigint, OUT in_progress bigint,
  OUT mismatched bigint, OUT completed bigint, OUT released bigint,
  OUT expired_deleted bigint, OUT cleanup_runs bigint,
  OUT last_cleanup timestamptz, OUT last_cleanup_deleted bigint, OUT stats_since timestamptz,
  OUT last_error text, OUT note text,
  OUT orphan_passes bigint, OUT last_orphan_pass timestamptz,
  OUT worker_start_failures bigint, OUT last_start_failure timestamptz)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idempotency_stats_rows'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.idempotency_stats_rows() IS
  'Raw rows behind the idempotency_stats views.';
REVOKE ALL ON FUNCTION @extschema@.idempotency_stats_rows() FROM PUBLIC;

CREATE VIEW @extschema@.idempotency_stats AS
  SELECT d.datname, s.*
    FROM @extschema@.idempotency_stats_rows() s
    LEFT JOIN pg_catalog.pg_database d ON d.oid OPERATOR(pg_catalog.=) s.database;
COMMENT ON VIEW @extschema@.idempotency_stats IS
  'Per database since server start: claim outcomes, completions, releases, cleanup runs and '
  'deleted keys; passes over keys of dropped roles (orphan_passes, last_orphan_pass); '
  'cleanup workers that could not start for want of a max_worker_processes slot '
  '(worker_start_failures, last_start_failure). Needs shared_preload_libraries = '
  '''idempotency''; without it, one row says so. Monitoring roles read '
  'idempotency_monitor.idempotency_stats.';

-- Monitoring roles read the statistics and nothing else. Until 1.1 they had USAGE on this
-- schema, which let them call claim_key and write keys of their own.
REVOKE USAGE ON SCHEMA @extschema@ FROM pg_monitor;

-- A schema of the extension (dropped with it) with the one view monitoring roles need.
-- Without IF NOT EXISTS: a schema of this name made by someone else beforehand makes CREATE
-- EXTENSION (or this update) fail instead of handing over a schema its maker controls.
CREATE SCHEMA idempotency_monitor;
COMMENT ON SCHEMA idempotency_monitor IS
  'The statistics of extension idempotency for monitoring roles: pg_monitor has USAGE here '
  'and SELECT on idempotency_stats, and nothing in schema idempotency. Created by CREATE '
  'EXTENSION idempotency, which fails if a schema of this name exists already.';
CREATE VIEW idempotency_monitor.idempotency_stats AS
  SELECT * FROM @extschema@.idempotency_stats;
COMMENT ON VIEW idempotency_monitor.idempotency_stats IS
  'idempotency.idempotency_stats for monitoring roles (members of pg_monitor).';

-- Default privileges of the installing role may have granted rights on the objects above
-- (ALTER DEFAULT PRIVILEGES ... ON TABLES, FUNCTIONS or SCHEMAS): nobody but their owner keeps
-- one; the grants meant follow.
DO $revoke$
DECLARE
  item record;
BEGIN
  FOR item IN
    SELECT 'TABLE' AS kind, c.oid::pg_catalog.regclass::pg_catalog.text AS name, a.grantee
      FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
     WHERE c.oid OPERATOR(pg_catalog.=) ANY (ARRAY['@extschema@.idempotency_stats'::pg_catalog.regclass,
             'idempotency_monitor.idempotency_stats'::pg_catalog.regclass]::pg_catalog.oid[])
       AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    UNION
    SELECT 'FUNCTION', p.oid::pg_catalog.regprocedure::pg_catalog.text, a.grantee
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.idempotency_stats_rows()'::pg_catalog.regprocedure
       AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
    UNION
    SELECT 'SCHEMA', pg_catalog.quote_ident(n.nspname), a.grantee
      FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
     WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency_monitor'
       AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
  LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %s', item.kind, item.name,
      CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
           ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END);
  END LOOP;
END
$revoke$;

-- A view calls its functions with the querying role's rights: EXECUTE on the rows function.
GRANT EXECUTE ON FUNCTION @extschema@.idempotency_stats_rows() TO pg_monitor;
GRANT USAGE ON SCHEMA idempotency_monitor TO pg_monitor;
GRANT SELECT ON idempotency_monitor.idempotency_stats TO pg_monitor;

-------------------------------------------------------------------------------
-- Security checks (section: security)
-------------------------------------------------------------------------------

-- No role but a superuser creates or changes anything in the extension's schema. Calls
-- refuse (42501) while another role may create objects there or while an object there is
-- not the extension's (src/installation_check.hpp); but a look-alike planted there (say
-- complete_key(text, text, text), which a call with untyped literals matches better) is
-- not the extension's code, and would run without any check of ours. This trigger refuses
-- the planting itself: any DDL command of a role that is not a superuser that creates or
-- changes an object in the schema.
CREATE FUNCTION @extschema@.guard_schema() RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idempotency_guard_schema'
LANGUAGE C;
COMMENT ON FUNCTION @extschema@.guard_schema() IS
  'Event trigger function of idempotency_guard_schema: refuses (42501) a DDL command of a role '
  'that is not a superuser when it created or changed an object in the extension''s schema.';
REVOKE ALL ON FUNCTION @extschema@.guard_schema() FROM PUBLIC;

CREATE EVENT TRIGGER idempotency_guard_schema ON ddl_command_end
  EXECUTE FUNCTION @extschema@.guard_schema();
COMMENT ON EVENT TRIGGER idempotency_guard_schema IS
  'Only superusers create or change objects in the schema of extension idempotency: another '
  'role''s look-alike there could catch the calls of every role (see SECURITY.md).';

-------------------------------------------------------------------------------
-- Responses replayed as sent: body bytes, status and headers (section: responses)
-------------------------------------------------------------------------------

-- A response as the first request sent it, beside the jsonb response of 1.0: the body's bytes
-- (any content type, not necessarily UTF-8) and its headers; the status is response_code. Last
-- in the row, with the other columns a completion writes, so that its WAL record stays small.
-- One statement each, run by EXECUTE: Citus passes a DDL statement on to the shards as its own
-- text, and to the shell table of each worker, which then runs this script for its own
-- objects and finds the columns there (IF NOT EXISTS). Adding a column without a default
-- rewrites nothing.
DO $$
BEGIN
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ADD COLUMN IF NOT EXISTS response_body pg_catalog.bytea';
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ADD COLUMN IF NOT EXISTS response_headers pg_catalog.jsonb';
END
$$;
COMMENT ON COLUMN @extschema@.idempotency_keys.response_body IS
  'Stored response body, the bytes exactly as sent, replayed byte for byte; NULL = none.';
COMMENT ON COLUMN @extschema@.idempotency_keys.response_headers IS
  'Stored response headers: a JSON object whose values are strings or arrays of strings; NULL = none.';

ALTER TYPE @extschema@.claim_result ADD ATTRIBUTE response_body pg_catalog.bytea;
ALTER TYPE @extschema@.claim_result ADD ATTRIBUTE response_headers pg_catalog.jsonb;
COMMENT ON TYPE @extschema@.claim_result IS
  'Result of claim_key and complete_key. token is set only for claimed / reclaimed; response, '
  'response_code, response_body and response_headers only for replay; retry_after only for '
  'in_progress.';

-- complete_key, claim_keys and complete_keys gain the response as sent (arguments with
-- defaults at the end, result columns at the end), so every 1.1 call, positional or named,
-- keeps working. A function's arguments and result columns cannot change in place: each is
-- dropped and created again, which gives it a new OID. On Citus, run
-- create_distributed_function for complete_key and complete_keys again after this update
-- (and for claim_keys if it was distributed).
DROP FUNCTION @extschema@.complete_key(pg_catalog.text, pg_catalog.uuid, pg_catalog.jsonb,
                                       pg_catalog.int4, pg_catalog.text);
CREATE FUNCTION @extschema@.complete_key(
  key                  pg_catalog.text,
  token                pg_catalog.uuid,
  response             pg_catalog.jsonb,
  response_code        pg_catalog.int4        DEFAULT NULL,
  scope                pg_catalog.text        DEFAULT '',
  response_body        pg_catalog.bytea       DEFAULT NULL,
  response_headers     pg_catalog.jsonb       DEFAULT NULL)
RETURNS @extschema@.claim_result
AS 'MODULE_PATHNAME', 'complete_key'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.complete_key(pg_catalog.text, pg_catalog.uuid, pg_catalog.jsonb,
                                             pg_catalog.int4, pg_catalog.text, pg_catalog.bytea,
                                             pg_catalog.jsonb) IS
  'Stores the outcome of a claim held with `token`: a jsonb response and code, and optionally '
  'the response as sent (body bytes and headers, replayed byte for byte); duplicates then get '
  'replay. Fenced: a token that no longer holds the key is rejected (55000).';

DROP FUNCTION @extschema@.claim_keys(pg_catalog.text[], pg_catalog.bytea[], pg_catalog.text,
                                     pg_catalog.interval, pg_catalog.interval);
CREATE FUNCTION @extschema@.claim_keys(
  keys                 pg_catalog.text[],
  fingerprints         pg_catalog.bytea[]     DEFAULT NULL,
  scope                pg_catalog.text        DEFAULT '',
  ttl                  pg_catalog.interval    DEFAULT NULL,
  lease                pg_catalog.interval    DEFAULT NULL,
  OUT ordinality       pg_catalog.int4,
  OUT key              pg_catalog.text,
  OUT status           @extschema@.claim_status,
  OUT token            pg_catalog.uuid,
  OUT response         pg_catalog.jsonb,
  OUT response_code    pg_catalog.int4,
  OUT fingerprint      pg_catalog.bytea,
  OUT recovery_point   pg_catalog.text,
  OUT attempts         pg_catalog.int4,
  OUT created_at       pg_catalog.timestamptz,
  OUT expires_at       pg_catalog.timestamptz,
  OUT retry_after      pg_catalog.interval,
  OUT response_body    pg_catalog.bytea,
  OUT response_headers pg_catalog.jsonb)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'claim_keys'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION @extschema@.claim_keys(pg_catalog.text[], pg_catalog.bytea[], pg_catalog.text,
                                           pg_catalog.interval, pg_catalog.interval) IS
  'Claims a batch of keys of one scope in the caller''s transaction: one row per key, in '
  'input order, as claim_key (wait 0) would answer each. fingerprints, when given, has one '
  'element per key. A repeated key: the first occurrence decides, later ones get in_progress '
  '(or replay / mismatch like the first). No per-key lock is kept.';

-- Element i completes keys[i] held with tokens[i], storing responses[i], response_codes[i],
-- response_bodies[i] and response_headers[i] (a NULL array: none of that part).
DROP FUNCTION @extschema@.complete_keys(pg_catalog.text[], pg_catalog.uuid[], pg_catalog.jsonb[],
                                        pg_catalog.int4[], pg_catalog.text);
CREATE FUNCTION @extschema@.complete_keys(
  keys                 pg_catalog.text[],
  tokens               pg_catalog.uuid[],
  responses            pg_catalog.jsonb[],
  response_codes       pg_catalog.int4[]      DEFAULT NULL,
  scope                pg_catalog.text        DEFAULT '',
  response_bodies      pg_catalog.bytea[]     DEFAULT NULL,
  response_headers     pg_catalog.jsonb[]     DEFAULT NULL,
  OUT ordinality       pg_catalog.int4,
  OUT key              pg_catalog.text,
  OUT status           @extschema@.claim_status,
  OUT token            pg_catalog.uuid,
  OUT response         pg_catalog.jsonb,
  OUT response_code    pg_catalog.int4,
  OUT fingerprint      pg_catalog.bytea,
  OUT recovery_point   pg_catalog.text,
  OUT attempts         pg_catalog.int4,
  OUT created_at       pg_catalog.timestamptz,
  OUT expires_at       pg_catalog.timestamptz,
  OUT retry_after      pg_catalog.interval,
  OUT response_body    pg_catalog.bytea,
  OUT response_headers pg_catalog.jsonb)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'complete_keys'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION @extschema@.complete_keys(pg_catalog.text[], pg_catalog.uuid[], pg_catalog.jsonb[],
                                              pg_catalog.int4[], pg_catalog.text, pg_catalog.bytea[],
                                              pg_catalog.jsonb[]) IS
  'Stores the outcomes of a batch of claims (element i: keys[i], tokens[i], responses[i], '
  'response_codes[i], response_bodies[i], response_headers[i]); one row per key, in input '
  'order, as complete_key answers. Fenced like complete_key: any refused element fails the '
  'whole call, which then changes nothing.';
