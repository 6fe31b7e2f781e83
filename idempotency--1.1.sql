-- idempotency 1.0: idempotency keys that live beside the business data.
-- Every object is created in the extension's schema (@extschema@, always "idempotency": see
-- the control file); the C++ code finds its table through that schema by OID, never through
-- search_path. Every name and operator below is schema-qualified.

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

-------------------------------------------------------------------------------
-- The schema must be one that nobody but superusers controls (SECURITY.md). CREATE
-- EXTENSION creates it when it is missing; one prepared beforehand is accepted only if a
-- superuser owns it, no other role may create objects in it, and it is empty.
-------------------------------------------------------------------------------

DO $check$
DECLARE
  target oid := pg_catalog.to_regnamespace('@extschema@')::pg_catalog.oid;
  schema_owner pg_catalog.name;
  untrusted pg_catalog.name;
BEGIN
  SELECT r.rolname INTO schema_owner
    FROM pg_catalog.pg_namespace n JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) n.nspowner
   WHERE n.oid OPERATOR(pg_catalog.=) target AND NOT r.rolsuper;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = pg_catalog.format('schema %I is owned by role %I, which is not a superuser',
                                  '@extschema@', schema_owner),
      HINT = 'The extension''s schema must be controlled by superusers only: drop or rename this schema, then CREATE EXTENSION idempotency creates its own.';
  END IF;
  SELECT r.rolname INTO untrusted
    FROM pg_catalog.pg_roles r
   WHERE NOT r.rolsuper AND pg_catalog.has_schema_privilege(r.oid, target, 'CREATE')
   LIMIT 1;
  IF FOUND THEN
    RAISE EXCEPTION USING ERRCODE = '42501',
      MESSAGE = pg_catalog.format('role %I, which is not a superuser, may create objects in schema %I',
                                  untrusted, '@extschema@'),
      HINT = pg_catalog.format('REVOKE CREATE ON SCHEMA %I FROM the roles that hold it, or let CREATE EXTENSION create the schema.', '@extschema@');
  END IF;
  IF EXISTS (SELECT FROM pg_catalog.pg_class WHERE relnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_proc WHERE pronamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_type WHERE typnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_operator WHERE oprnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_collation WHERE collnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_conversion WHERE connamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_opclass WHERE opcnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_opfamily WHERE opfnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_ts_config WHERE cfgnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_ts_dict WHERE dictnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_ts_parser WHERE prsnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_ts_template WHERE tmplnamespace OPERATOR(pg_catalog.=) target)
     OR EXISTS (SELECT FROM pg_catalog.pg_statistic_ext WHERE stxnamespace OPERATOR(pg_catalog.=) target)
  THEN
    RAISE EXCEPTION USING ERRCODE = '42P06',
      MESSAGE = pg_catalog.format('schema %I already holds objects', '@extschema@'),
      HINT = 'CREATE EXTENSION idempotency needs an empty schema of its own: drop or rename this schema first.';
  END IF;
END
$check$;

-------------------------------------------------------------------------------
-- Types
-------------------------------------------------------------------------------

CREATE TYPE @extschema@.key_status AS ENUM ('processing', 'completed');
COMMENT ON TYPE @extschema@.key_status IS
  'State of a stored idempotency key: processing (claimed, no outcome yet) or completed.';

CREATE TYPE @extschema@.claim_status AS ENUM
  ('claimed', 'reclaimed', 'replay', 'mismatch', 'in_progress');
COMMENT ON TYPE @extschema@.claim_status IS
  'What claim_key decided: claimed / reclaimed (do the work), replay (return the stored '
  'response), mismatch (same key, different request: reject, HTTP 422), in_progress '
  '(another caller holds the key: reject, HTTP 409 with Retry-After).';

CREATE TYPE @extschema@.claim_result AS (
  status         @extschema@.claim_status,
  token          uuid,
  response       jsonb,
  response_code  integer,
  fingerprint    bytea,
  recovery_point text,
  attempts       integer,
  created_at     timestamptz,
  expires_at     timestamptz,
  retry_after    interval
);
COMMENT ON TYPE @extschema@.claim_result IS
  'Result of claim_key and complete_key. token is set only for claimed / reclaimed; response '
  'and response_code only for replay; retry_after only for in_progress.';

-------------------------------------------------------------------------------
-- The key table
-------------------------------------------------------------------------------

-- Columns that a completion changes come last, so that the WAL record of that update
-- (prefix/suffix compressed on the same page) stays small.
-- A key is (owner, scope, key): each role has its own keys, and another role's key of the
-- same scope and name is a different key.
CREATE TABLE @extschema@.idempotency_keys (
  owner          pg_catalog.regrole NOT NULL,
  scope          pg_catalog.text COLLATE pg_catalog."C" NOT NULL DEFAULT '',
  key            pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
  fingerprint    pg_catalog.bytea,
  attempts       pg_catalog.int4 NOT NULL DEFAULT 1,
  ttl            pg_catalog.interval NOT NULL,
  lease          pg_catalog.interval NOT NULL,
  created_at     pg_catalog.timestamptz NOT NULL,
  expires_at     pg_catalog.timestamptz NOT NULL,
  lease_token    pg_catalog.uuid,
  locked_until   pg_catalog.timestamptz,
  recovery_point pg_catalog.text,
  status         @extschema@.key_status NOT NULL DEFAULT 'processing',
  response_code  pg_catalog.int4,
  updated_at     pg_catalog.timestamptz NOT NULL,
  response       pg_catalog.jsonb,
  PRIMARY KEY (owner, scope, key)
) WITH (
  -- Keys churn: every row is deleted after its ttl. Vacuum early so that dead index
  -- entries do not slow the key lookups, and leave room on each page for the completion
  -- update to stay on the same page (a HOT update).
  fillfactor = 90,
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.05,
  autovacuum_analyze_scale_factor = 0.05
);

CREATE INDEX idempotency_keys_expires_at_idx ON @extschema@.idempotency_keys (expires_at);

COMMENT ON TABLE @extschema@.idempotency_keys IS
  'One row per (owner, scope, key): the claim, its lease and the stored outcome. Reached only '
  'through claim_key / complete_key / release_key / checkpoint_key, which act as the '
  'extension owner for the caller''s own keys.';
COMMENT ON COLUMN @extschema@.idempotency_keys.scope IS 'Namespace of the key (tenant, API key, endpoint); '''' by default.';
COMMENT ON COLUMN @extschema@.idempotency_keys.key IS 'The client''s idempotency key (at most idempotency.max_key_length bytes).';
COMMENT ON COLUMN @extschema@.idempotency_keys.owner IS 'Role that claimed the key (current_user at the call) and part of its identity. regrole: pg_dump writes the name, so a restore maps it to the role of that name; keys of dropped roles are deleted by the cleanup and left out of dumps.';
COMMENT ON COLUMN @extschema@.idempotency_keys.fingerprint IS 'Digest of the request payload; NULL = not checked.';
COMMENT ON COLUMN @extschema@.idempotency_keys.attempts IS 'How many times the key was claimed (1 + reclaims).';
COMMENT ON COLUMN @extschema@.idempotency_keys.ttl IS 'How long the key is kept, counted from completion.';
COMMENT ON COLUMN @extschema@.idempotency_keys.lease IS 'The lease the claim was made with; checkpoint_key renews by it when given no lease.';
COMMENT ON COLUMN @extschema@.idempotency_keys.created_at IS 'When the key was first claimed.';
COMMENT ON COLUMN @extschema@.idempotency_keys.expires_at IS 'After this time the key counts as absent and the cleanup deletes it.';
COMMENT ON COLUMN @extschema@.idempotency_keys.lease_token IS 'Fencing token (UUIDv7) of the current holder; NULL once released.';
COMMENT ON COLUMN @extschema@.idempotency_keys.locked_until IS 'End of the current holder''s lease.';
COMMENT ON COLUMN @extschema@.idempotency_keys.recovery_point IS 'Last checkpoint of a multi-step handler.';
COMMENT ON COLUMN @extschema@.idempotency_keys.status IS 'processing or completed.';
COMMENT ON COLUMN @extschema@.idempotency_keys.response_code IS 'Stored outcome code (for example an HTTP status).';
COMMENT ON COLUMN @extschema@.idempotency_keys.updated_at IS 'Last change of the row.';
COMMENT ON COLUMN @extschema@.idempotency_keys.response IS 'Stored outcome replayed to duplicates.';
COMMENT ON INDEX @extschema@.idempotency_keys_expires_at_idx IS 'Serves the cleanup''s scan for expired keys.';

-- pg_dump keeps the rows: a dump and restore loses no key. Keys of dropped roles are left
-- out: their owner would be written as a bare OID, which a restore would hand to whatever
-- role has that OID there.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_keys',
  'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.oid OPERATOR(pg_catalog.=) owner)');

-- Applications reach the rows only through the functions below.
REVOKE ALL ON TABLE @extschema@.idempotency_keys FROM PUBLIC;

-- The secret of the key locks' tags (key_lock.hpp): pg_locks shows every lock to every
-- role, and without a secret a role could compute the tag of a key it guesses.
CREATE TABLE @extschema@.key_lock_salt (salt pg_catalog.bytea NOT NULL);
INSERT INTO @extschema@.key_lock_salt
  SELECT pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::pg_catalog.text
                                              OPERATOR(pg_catalog.||) pg_catalog.gen_random_uuid()::pg_catalog.text,
                                              '-', ''), 'hex');
REVOKE ALL ON TABLE @extschema@.key_lock_salt FROM PUBLIC;
COMMENT ON TABLE @extschema@.key_lock_salt IS
  'A random secret mixed into the tags of the per-key locks, so that pg_locks reveals no key.';

-------------------------------------------------------------------------------
-- The claim protocol. The functions run as their caller (SECURITY INVOKER): keys belong to
-- current_user. The C++ code reaches the table as the extension owner, under
-- SECURITY_RESTRICTED_OPERATION with search_path = pg_catalog, pg_temp.
-------------------------------------------------------------------------------

CREATE FUNCTION @extschema@.claim_key(
  key         text,
  fingerprint bytea    DEFAULT NULL,
  scope       text     DEFAULT '',
  ttl         interval DEFAULT NULL,
  lease       interval DEFAULT NULL,
  wait        interval DEFAULT '0')
RETURNS @extschema@.claim_result
AS 'MODULE_PATHNAME', 'claim_key'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.claim_key(text, bytea, text, interval, interval, interval) IS
  'Claims (scope, key) inside the caller''s transaction, or answers replay / mismatch / '
  'in_progress. Waits at most `wait` for a holder to finish.';

CREATE FUNCTION @extschema@.complete_key(
  key           text,
  token         uuid,
  response      jsonb,
  response_code integer DEFAULT NULL,
  scope         text    DEFAULT '')
RETURNS @extschema@.claim_result
AS 'MODULE_PATHNAME', 'complete_key'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.complete_key(text, uuid, jsonb, integer, text) IS
  'Stores the outcome of a claim held with `token`; duplicates then get replay. Fenced: '
  'a token that no longer holds the key is rejected (55000).';

CREATE FUNCTION @extschema@.release_key(key text, token uuid, scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'release_key'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.release_key(text, uuid, text) IS
  'Gives a claim up without an outcome (a transient failure): the next claim_key gets '
  'reclaimed at once. Fenced like complete_key.';

CREATE FUNCTION @extschema@.checkpoint_key(
  key            text,
  token          uuid,
  recovery_point text,
  scope          text     DEFAULT '',
  lease          interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'checkpoint_key'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.checkpoint_key(text, uuid, text, text, interval) IS
  'Records the progress of a multi-step handler and renews the lease (a heartbeat); '
  'returns the new end of the lease. Fenced like complete_key.';

-------------------------------------------------------------------------------
-- Helpers
-------------------------------------------------------------------------------

CREATE FUNCTION @extschema@.request_fingerprint(payload jsonb) RETURNS bytea
AS 'MODULE_PATHNAME', 'request_fingerprint_jsonb'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.request_fingerprint(jsonb) IS
  'SHA-256 of a jsonb payload; values equal as jsonb (any key order or spacing) give equal '
  'fingerprints.';

CREATE FUNCTION @extschema@.request_fingerprint(payload text) RETURNS bytea
AS 'MODULE_PATHNAME', 'request_fingerprint_bytes'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.request_fingerprint(text) IS 'SHA-256 of the text''s bytes.';

CREATE FUNCTION @extschema@.request_fingerprint(payload bytea) RETURNS bytea
AS 'MODULE_PATHNAME', 'request_fingerprint_bytes'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.request_fingerprint(bytea) IS 'SHA-256 of the bytes.';

CREATE FUNCTION @extschema@.gen_uuid_v7() RETURNS uuid
AS 'MODULE_PATHNAME', 'gen_uuid_v7'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.gen_uuid_v7() IS
  'A UUID version 7 (RFC 9562, PostgreSQL 18 layout): time-ordered, strictly increasing '
  'within a session, 62 random bits from a CSPRNG.';

CREATE FUNCTION @extschema@.gen_uuid_v7(at timestamptz) RETURNS uuid
AS 'MODULE_PATHNAME', 'gen_uuid_v7_at'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.gen_uuid_v7(timestamptz) IS
  'A UUID version 7 for the given time (1970 to year 10889; 22008 outside).';

CREATE FUNCTION @extschema@.uuid_v7_time(id uuid) RETURNS timestamptz
AS 'MODULE_PATHNAME', 'uuid_v7_time'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.uuid_v7_time(uuid) IS
  'The time (millisecond precision) a version 7 UUID carries; NULL for other versions.';

-------------------------------------------------------------------------------
-- Cleanup and statistics
-------------------------------------------------------------------------------

CREATE FUNCTION @extschema@.idempotency_cleanup(batch_size integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idempotency_cleanup'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.idempotency_cleanup(integer) IS
  'Deletes expired keys now, in batches of batch_size (default idempotency.cleanup_batch_size) '
  'with SKIP LOCKED; returns how many were deleted. What the worker runs; usable from pg_cron.';
REVOKE ALL ON FUNCTION @extschema@.idempotency_cleanup(integer) FROM PUBLIC;

CREATE FUNCTION @extschema@.idempotency_stats_rows(
  OUT database oid, OUT shared_memory boolean,
  OUT claimed bigint, OUT reclaimed bigint, OUT replayed bigint, OUT in_progress bigint,
  OUT mismatched bigint, OUT completed bigint, OUT released bigint,
  OUT expired_deleted bigint, OUT cleanup_runs bigint,
  OUT last_cleanup timestamptz, OUT last_cleanup_deleted bigint, OUT stats_since timestamptz,
  OUT last_error text, OUT note text)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'idempotency_stats_rows'
LANGUAGE C VOLATILE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.idempotency_stats_rows() IS
  'Raw rows behind the idempotency_stats view.';

CREATE VIEW @extschema@.idempotency_stats AS
  SELECT d.datname, s.*
    FROM @extschema@.idempotency_stats_rows() s
    LEFT JOIN pg_catalog.pg_database d ON d.oid = s.database;
COMMENT ON VIEW @extschema@.idempotency_stats IS
  'Per database since server start: claim outcomes, completions, releases, cleanup runs and '
  'deleted keys. Needs shared_preload_libraries = ''idempotency''; without it, one row says so.';
-- Monitoring data, like pg_stat_*: for superusers and members of pg_monitor. (A view runs
-- its functions with the rights of the querying role, so the function is granted too.)
REVOKE ALL ON FUNCTION @extschema@.idempotency_stats_rows() FROM PUBLIC;

-- Default privileges of the installing role (ALTER DEFAULT PRIVILEGES ... ON TABLES or ON
-- FUNCTIONS) may have granted rights on the objects above to other roles. On the tables that
-- would be fatal: a role with TRIGGER on idempotency_keys runs code as the extension owner,
-- one with SELECT reads every role's responses. Nobody but the owner keeps a right on a
-- table or on the two restricted functions; the grants this script means are made below.
DO $revoke$
DECLARE
  item record;
BEGIN
  FOR item IN
    SELECT DISTINCT 'TABLE' AS kind, c.oid::pg_catalog.regclass::pg_catalog.text AS name, a.grantee
      FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
     WHERE c.relnamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace('@extschema@')::pg_catalog.oid
       AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    UNION
    SELECT DISTINCT 'FUNCTION', p.oid::pg_catalog.regprocedure::pg_catalog.text, a.grantee
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.pronamespace OPERATOR(pg_catalog.=) pg_catalog.to_regnamespace('@extschema@')::pg_catalog.oid
       AND p.proname OPERATOR(pg_catalog.=) ANY (ARRAY['idempotency_cleanup', 'idempotency_stats_rows']::pg_catalog.name[])
       AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
  LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %s', item.kind, item.name,
      CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
           ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END);
  END LOOP;
END
$revoke$;

GRANT EXECUTE ON FUNCTION @extschema@.idempotency_stats_rows() TO pg_monitor;
GRANT SELECT ON @extschema@.idempotency_stats TO pg_monitor;
-- Monitoring roles reach the view through the schema (USAGE lets them call the claim
-- functions too, for keys of their own: nothing of another role's).
GRANT USAGE ON SCHEMA @extschema@ TO pg_monitor;
-- idempotency 1.0 -> 1.1 (issue #15): batch functions for queue consumers.
-- ALTER EXTENSION idempotency UPDATE TO '1.1' runs this; CREATE EXTENSION of 1.1 runs
-- idempotency--1.0.sql and then this script, so a fresh install and an upgraded one are
-- made by the same statements. The rows are kept as they are; the primary key is rebuilt.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.1'" to load this file. \quit

-- The primary key compares the key before the scope: every probe and insertion descends the
-- B-Tree comparing mostly keys, and a key right after the fixed-width owner is read without
-- walking over the scope (about half the comparison cost, an eighth of a new-key claim's
-- instructions). The identity is the same (owner, scope, key). Rebuilding the index holds
-- the table's ACCESS EXCLUSIVE lock for as long as the build takes (seconds per million keys).
-- Two statements, each run by EXECUTE: Citus refuses ADD CONSTRAINT beside another
-- subcommand on a distributed table, and passes a DDL statement on to the shards as the text
-- of the statement, which must be that statement alone, not this whole script.
DO $$
BEGIN
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys DROP CONSTRAINT idempotency_keys_pkey';
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys '
          'ADD CONSTRAINT idempotency_keys_pkey PRIMARY KEY (owner, key, scope)';
END
$$;

-- One row per element of keys, in input order: the element's ordinality (1-based), its key
-- and the fields of claim_result. Each key is claimed as claim_key would claim it with
-- wait = 0; a key repeated in the batch is decided by its first occurrence, and the later
-- ones get what a duplicate gets (in_progress while that claim is open).
CREATE FUNCTION @extschema@.claim_keys(
  keys           text[],
  fingerprints   bytea[]  DEFAULT NULL,
  scope          text     DEFAULT '',
  ttl            interval DEFAULT NULL,
  lease          interval DEFAULT NULL,
  OUT ordinality     integer,
  OUT key            text,
  OUT status         @extschema@.claim_status,
  OUT token          uuid,
  OUT response       jsonb,
  OUT response_code  integer,
  OUT fingerprint    bytea,
  OUT recovery_point text,
  OUT attempts       integer,
  OUT created_at     timestamptz,
  OUT expires_at     timestamptz,
  OUT retry_after    interval)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'claim_keys'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION @extschema@.claim_keys(text[], bytea[], text, interval, interval) IS
  'Claims a batch of keys of one scope in the caller''s transaction: one row per key, in '
  'input order, as claim_key (wait 0) would answer each. fingerprints, when given, has one '
  'element per key. A repeated key: the first occurrence decides, later ones get in_progress '
  '(or replay / mismatch like the first). No per-key lock is kept.';

-- Stores the outcomes of a batch: element i completes keys[i] held with tokens[i], storing
-- responses[i] and response_codes[i] (NULL arrays: no response / no code). One row per
-- element, as complete_key answers. Any refused element fails the whole call.
CREATE FUNCTION @extschema@.complete_keys(
  keys           text[],
  tokens         uuid[],
  responses      jsonb[],
  response_codes integer[] DEFAULT NULL,
  scope          text      DEFAULT '',
  OUT ordinality     integer,
  OUT key            text,
  OUT status         @extschema@.claim_status,
  OUT token          uuid,
  OUT response       jsonb,
  OUT response_code  integer,
  OUT fingerprint    bytea,
  OUT recovery_point text,
  OUT attempts       integer,
  OUT created_at     timestamptz,
  OUT expires_at     timestamptz,
  OUT retry_after    interval)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'complete_keys'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE ROWS 100;
COMMENT ON FUNCTION @extschema@.complete_keys(text[], uuid[], jsonb[], integer[], text) IS
  'Stores the outcomes of a batch of claims (element i: keys[i], tokens[i], responses[i], '
  'response_codes[i]); one row per key, in input order, as complete_key answers. Fenced like '
  'complete_key: any refused element fails the whole call, which then changes nothing.';
