-- idempotency 1.2 -> 1.3. ALTER EXTENSION idempotency UPDATE TO '1.3' runs this; CREATE
-- EXTENSION of 1.3 runs idempotency--1.0.sql and every update script up to this one, so a fresh
-- install and an upgraded one are made by the same statements. Each part of the update has a
-- section of its own below.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.3'" to load this file. \quit

-------------------------------------------------------------------------------
-- A key's owner is a principal, not only a name (section: owner identity)
-------------------------------------------------------------------------------

-- 1.2 identified a key's owner by the role's name alone: a role created later under the name of
-- a dropped role (or renamed to it) read, completed and held the earlier role's keys until the
-- cleanup deleted them. From 1.3 each row also carries the stamp of the role that wrote it: its
-- OID and the system identifier of the cluster it was written in. The name stays the key's
-- identity (the primary key is unchanged) and what moves with the row; the stamp decides, in
-- this cluster, whether the role of that name now is the one that wrote the row (SECURITY.md,
-- "Keys and role names"). A row stamped in another cluster (dump and restore, pg_upgrade,
-- logical replication, a Citus shard moved to another node), or not stamped, is adopted by
-- name, as pg_dump matches the owners of objects.
-- One statement each, run by EXECUTE, IF NOT EXISTS: Citus passes a DDL statement on to the
-- shards as its own text, and to the shell table of each worker, which then runs this script for
-- its own objects and finds the columns there (as 1.2's response columns).
DO $$
BEGIN
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ADD COLUMN IF NOT EXISTS owner_oid pg_catalog.oid';
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ADD COLUMN IF NOT EXISTS owner_system pg_catalog.int8';
END
$$;

COMMENT ON COLUMN @extschema@.idempotency_keys.owner IS
  'Name of the role that claimed the key (current_user at the call) and part of its identity: '
  'the key answers only a role of this name, and in the cluster that stamped it (owner_oid, '
  'owner_system) only the role of that OID. Keys of dropped or renamed roles are deleted by the '
  'cleanup and left out of dumps.';
COMMENT ON COLUMN @extschema@.idempotency_keys.owner_oid IS
  'OID of the role that claimed the key, in the cluster owner_system names; NULL: not stamped '
  '(adopted by name). A role of the same name with another OID (the old role dropped or renamed) '
  'never reads, completes or holds the key.';
COMMENT ON COLUMN @extschema@.idempotency_keys.owner_system IS
  'System identifier (pg_control_system()) of the cluster whose role owner_oid is; a row from '
  'another cluster (restored, replicated, moved) is adopted by the role of its owner name, and '
  'stamped by the cleanup. NULL: not stamped.';

-- The keys in place when 1.3 arrives were written here by the role that has their name now, or
-- by a role since dropped (the cleanup had not yet deleted its keys): each row whose name names
-- a role is stamped with that role's OID, and the rest are deleted as orphans. A distributed
-- table (Citus) keeps its rows unstamped, adopted by name: a query of pg_authid runs on the
-- coordinator, with the coordinator's OIDs, while a shard's rows are read on their own node;
-- each node's cleanup stamps its placements' rows with its own OIDs.
DO $$
DECLARE
  distributed pg_catalog.bool := false;
BEGIN
  IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition '
            'WHERE logicalrelid OPERATOR(pg_catalog.=) ''@extschema@.idempotency_keys''::pg_catalog.regclass)'
       INTO distributed;
  END IF;
  IF NOT distributed THEN
    EXECUTE 'UPDATE @extschema@.idempotency_keys k SET owner_oid = r.oid, '
            'owner_system = (SELECT system_identifier FROM pg_catalog.pg_control_system()) '
            'FROM pg_catalog.pg_authid r WHERE r.rolname OPERATOR(pg_catalog.=) k.owner';
    EXECUTE 'DELETE FROM @extschema@.idempotency_keys WHERE owner_oid IS NULL';
  END IF;
END
$$;

-- pg_dump leaves out keys whose owner names no role, and keys stamped in this cluster by a role
-- that is gone, even when a new role has its name (the dump would hand them to that role).
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_keys',
  'WHERE EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) owner '
  'AND (owner_system IS NULL OR owner_oid IS NULL OR r.oid OPERATOR(pg_catalog.=) owner_oid '
  'OR owner_system OPERATOR(pg_catalog.<>) '
  '(SELECT system_identifier FROM pg_catalog.pg_control_system())))');

-------------------------------------------------------------------------------
-- The key's life cycle (section: life cycle, issue #37; SPEC section 3.5)
-------------------------------------------------------------------------------

-- Look: what claim_key would answer now, deciding nothing. The answer is a claim_result, so
-- that code which reads claim_key's answer reads this one: claim_status gains no label (a
-- client that maps every label of claim_status keeps working). A key that claim_key would
-- claim (none, or expired) answers `claimed` with a NULL token and no other field; one whose
-- lease ended or that was released answers `reclaimed` with a NULL token and the stored
-- attempts (the claim would make attempt attempts + 1), recovery_point and fingerprint. The
-- NULL token is the sign that nothing was claimed: claim_key's claimed / reclaimed always
-- carry one.
CREATE FUNCTION @extschema@.look_key(
  key         text,
  fingerprint bytea DEFAULT NULL,
  scope       text  DEFAULT '')
RETURNS @extschema@.claim_result
AS 'MODULE_PATHNAME', 'look_key'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.look_key(text, bytea, text) IS
  'What claim_key(key, fingerprint, scope) would answer now, without claiming, writing, keeping '
  'a lock or waiting: replay (with the response), mismatch, in_progress (also at once for a '
  'key another open transaction is claiming), or claimed / reclaimed with a NULL token (a claim '
  'would take the key). Only the caller''s own keys: another role''s key does not exist for it. '
  'Errors as claim_key: 22004 NULL key or scope, 22023 empty key, 22001 key over '
  'idempotency.max_key_length or fingerprint over idempotency.max_fingerprint_size, 42501 '
  'inside a security-restricted operation.';

-- Forget: a role deletes its own key, so that the operation can run again (the next claim_key
-- answers claimed). Absent is no error (false), as a DELETE of no row is none: a retried
-- forget_key succeeds.
CREATE FUNCTION @extschema@.forget_key(
  key   text,
  token uuid DEFAULT NULL,
  scope text DEFAULT '')
RETURNS boolean
AS 'MODULE_PATHNAME', 'forget_key'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.forget_key(text, uuid, text) IS
  'Deletes the caller''s own key (scope, key): completed, released, expired, or with an ended '
  'lease; returns false when the caller has no such key. A key held by a live claim is refused '
  '(55000) unless token is its holder''s; a token given must be the key''s (55000 otherwise). A '
  'key that another open transaction claims, completes or forgets is refused at once (55000), '
  'never waited for. A holder whose key was forgotten gets P0002 from complete_key. Counted in '
  'idempotency_stats.forgotten. Other errors as claim_key.';

-- The statistics gain `forgotten` (after the 1.2 columns: a library newer than its
-- installation still answers the 1.2 declaration). The views are made again.
DROP VIEW idempotency_monitor.idempotency_stats;
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
  OUT worker_start_failures bigint, OUT last_start_failure timestamptz,
  OUT forgotten bigint)
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
  'Per database since server start: claim outcomes, completions, releases, keys forgotten by '
  'forget_key (forgotten), cleanup runs and deleted keys; passes over keys of dropped roles '
  '(orphan_passes, last_orphan_pass); cleanup workers that could not start for want of a '
  'max_worker_processes slot (worker_start_failures, last_start_failure). Needs '
  'shared_preload_libraries = ''idempotency''; without it, one row says so. Monitoring roles '
  'read idempotency_monitor.idempotency_stats.';
CREATE VIEW idempotency_monitor.idempotency_stats AS
  SELECT * FROM @extschema@.idempotency_stats;
COMMENT ON VIEW idempotency_monitor.idempotency_stats IS
  'idempotency.idempotency_stats for monitoring roles (members of pg_monitor).';

-- Default privileges of the installing role may have granted rights on the objects made
-- again here: nobody but their owner keeps one; the grants meant follow.
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
  LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON %s %s FROM %s', item.kind, item.name,
      CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
           ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END);
  END LOOP;
END
$revoke$;
GRANT EXECUTE ON FUNCTION @extschema@.idempotency_stats_rows() TO pg_monitor;
GRANT SELECT ON idempotency_monitor.idempotency_stats TO pg_monitor;

-- Stuck holders: per role and scope of this database, the claims in progress and the claims
-- whose lease ended with no one taking the key over (a handler that died, or hangs past its
-- lease). Counts and ages only: no key, no response, no token. Monitoring data, like
-- pg_stat_activity's: superusers and members of pg_monitor (through idempotency_monitor). It
-- reads the whole key table (a sequential scan): a query for an operator, not for a probe that
-- runs every second on a large table.
-- The rows come from a function that reads the table as the extension owner (no role needs a
-- right on the table, and no view depends on its columns).
CREATE FUNCTION @extschema@.stuck_holders_rows(
  OUT datname name, OUT role text, OUT scope text, OUT processing bigint,
  OUT oldest_claim_age interval, OUT leases_ended bigint)
RETURNS SETOF record
AS 'MODULE_PATHNAME', 'stuck_holders_rows'
LANGUAGE C VOLATILE STRICT PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.stuck_holders_rows() IS
  'Raw rows behind the stuck_holders views.';
REVOKE ALL ON FUNCTION @extschema@.stuck_holders_rows() FROM PUBLIC;
CREATE VIEW @extschema@.stuck_holders AS
  SELECT * FROM @extschema@.stuck_holders_rows();
COMMENT ON VIEW @extschema@.stuck_holders IS
  'Claims held now, per role (the key''s owner name) and scope of this database: processing '
  '(live leases), oldest_claim_age (since the oldest of these claims was first made) and '
  'leases_ended (leases that ended with no one taking the key over: a crashed or hung '
  'handler; the next claim_key reclaims them). Released and expired keys are not counted. No '
  'key values, responses or tokens. Reads the whole key table. For superusers; monitoring '
  'roles read idempotency_monitor.stuck_holders.';
CREATE VIEW idempotency_monitor.stuck_holders AS
  SELECT * FROM @extschema@.stuck_holders;
COMMENT ON VIEW idempotency_monitor.stuck_holders IS
  'idempotency.stuck_holders for monitoring roles (members of pg_monitor).';
DO $revoke$
DECLARE
  item record;
BEGIN
  FOR item IN
    SELECT 'TABLE ' || c.oid::pg_catalog.regclass::pg_catalog.text AS name, a.grantee
      FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
     WHERE c.oid OPERATOR(pg_catalog.=) ANY (ARRAY['@extschema@.stuck_holders'::pg_catalog.regclass,
             'idempotency_monitor.stuck_holders'::pg_catalog.regclass]::pg_catalog.oid[])
       AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
    UNION
    SELECT 'FUNCTION ' || p.oid::pg_catalog.regprocedure::pg_catalog.text, a.grantee
      FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
     WHERE p.oid OPERATOR(pg_catalog.=) '@extschema@.stuck_holders_rows()'::pg_catalog.regprocedure
       AND a.grantee OPERATOR(pg_catalog.<>) p.proowner
  LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON %s FROM %s', item.name,
      CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
           ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END);
  END LOOP;
END
$revoke$;
REVOKE ALL ON @extschema@.stuck_holders FROM PUBLIC;
REVOKE ALL ON idempotency_monitor.stuck_holders FROM PUBLIC;
GRANT EXECUTE ON FUNCTION @extschema@.stuck_holders_rows() TO pg_monitor;
GRANT SELECT ON idempotency_monitor.stuck_holders TO pg_monitor;

-- Tombstones: complete_key(..., response_ttl) drops the stored response (jsonb, body, headers)
-- response_ttl after the completion, while the key keeps its fingerprint (and response_code)
-- until its ttl: a duplicate then gets replay with response_dropped = true and no response,
-- and a request with another fingerprint still gets mismatch. NULL (the default), or a
-- response_ttl not shorter than the ttl, keeps 1.2's behaviour: the response lives as long as
-- the key. response_code is kept (four bytes): the API can still answer "done, with 201".
DO $$
BEGIN
  -- By EXECUTE, IF NOT EXISTS, as the stamp's columns above (Citus).
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ADD COLUMN IF NOT EXISTS response_expires_at pg_catalog.timestamptz';
END
$$;
COMMENT ON COLUMN @extschema@.idempotency_keys.response_expires_at IS
  'When the stored response (response, response_body, response_headers) stops being replayed '
  'and the cleanup drops it (complete_key''s response_ttl); the key stays until expires_at. '
  'NULL: the response lives as long as the key.';

ALTER TYPE @extschema@.claim_result ADD ATTRIBUTE response_dropped pg_catalog.bool;
COMMENT ON TYPE @extschema@.claim_result IS
  'Result of claim_key, complete_key and look_key. token is set only for claimed / reclaimed '
  'made by claim_key (look_key''s claimed / reclaimed carry none: nothing was claimed); '
  'response, response_code, response_body and response_headers only for replay; retry_after '
  'only for in_progress; response_dropped only for replay: true when the response was dropped '
  'after complete_key''s response_ttl (response, body and headers NULL, response_code kept).';

-- complete_key gains response_ttl (at the end, with a default: every 1.2 call keeps working).
-- On Citus, run create_distributed_function for complete_key again after this update.
DROP FUNCTION @extschema@.complete_key(pg_catalog.text, pg_catalog.uuid, pg_catalog.jsonb,
                                       pg_catalog.int4, pg_catalog.text, pg_catalog.bytea,
                                       pg_catalog.jsonb);
CREATE FUNCTION @extschema@.complete_key(
  key                  pg_catalog.text,
  token                pg_catalog.uuid,
  response             pg_catalog.jsonb,
  response_code        pg_catalog.int4        DEFAULT NULL,
  scope                pg_catalog.text        DEFAULT '',
  response_body        pg_catalog.bytea       DEFAULT NULL,
  response_headers     pg_catalog.jsonb       DEFAULT NULL,
  response_ttl         pg_catalog.interval    DEFAULT NULL)
RETURNS @extschema@.claim_result
AS 'MODULE_PATHNAME', 'complete_key'
LANGUAGE C VOLATILE SECURITY INVOKER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.complete_key(pg_catalog.text, pg_catalog.uuid, pg_catalog.jsonb,
                                             pg_catalog.int4, pg_catalog.text, pg_catalog.bytea,
                                             pg_catalog.jsonb, pg_catalog.interval) IS
  'Stores the outcome of a claim held with `token`: a jsonb response and code, and optionally '
  'the response as sent (body bytes and headers, replayed byte for byte); duplicates then get '
  'replay. response_ttl: the response is dropped that long after the completion while the key '
  'stays until its ttl (replay with response_dropped, mismatch still detected); NULL keeps it '
  'as long as the key; 22023 when not positive or over idempotency.max_ttl. Fenced: a token '
  'that no longer holds the key is rejected (55000).';

-- Expiry policy: what an API publishes about its keys (the IETF draft on the Idempotency-Key
-- header asks resources to say how long keys are kept). The values in force for the calling
-- session (a role's or database's settings included); claim_key's answer has each key's own
-- expires_at.
CREATE FUNCTION @extschema@.key_policy(
  OUT default_ttl       interval,
  OUT max_ttl           interval,
  OUT default_lease     interval,
  OUT max_lease         interval,
  OUT max_key_length    integer,
  OUT max_response_size integer)
RETURNS record
AS 'MODULE_PATHNAME', 'key_policy'
LANGUAGE C STABLE SECURITY INVOKER PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.key_policy() IS
  'The key policy in force for this session, from the settings idempotency.default_ttl, '
  'max_ttl, default_lease, max_lease, max_key_length and max_response_size: how long a key is '
  'kept by default (a completed key: ttl after its completion) and at most, the lease of a '
  'claim, and the largest key and response accepted. For an API to publish; changes nothing.';

-- The key of the expiry index on PostgreSQL 16 and later (below): expires_at rounded down to
-- its minute.
CREATE FUNCTION @extschema@.expiry_bucket(expires_at timestamptz) RETURNS timestamptz
AS 'MODULE_PATHNAME', 'expiry_bucket'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.expiry_bucket(timestamptz) IS
  'expires_at rounded down to its minute (infinity stays): the key of the expiry index on '
  'PostgreSQL 16 and later, so that keys written within a minute seldom widen its block '
  'ranges'' summaries. Never later than expires_at: bucket <= now finds every expired key.';

-- The cleanup's index on expires_at, chosen by the server's major version. A completion moves
-- expires_at (ttl counts from the completion): under a B-Tree on it, no completion is a HOT
-- update, and each completed key costs two more index entries (the primary key's included).
-- PostgreSQL 16 and later keep an update HOT when only summarizing (BRIN) indexes cover the
-- changed columns: there the index is a BRIN, and a completion writes no new B-Tree entry.
-- The BRIN is over expiry_bucket(expires_at), not expires_at: time only moves forward, so
-- nearly every new expiry would lie past its range's maximum and widen the summary (a WAL
-- record per claim and per completion); by the minute, keys written close together share
-- a value that the summary already holds. PostgreSQL 15 has no such update and keeps the
-- B-Tree, whose ordered walk the cleanup uses (docs/design.md, "The expiry index"). An update
-- with keys in place rebuilds the index. Under Citus, a distributed table's index is made on
-- the workers' shards at once, before their own update has made expiry_bucket: there the
-- update makes the BRIN over expires_at (a fresh install, distributed afterwards, gets the
-- minute); the direct path and the cleanup serve both.
DO $$
DECLARE
  distributed pg_catalog.bool := false;
  wanted pg_catalog.text := '@extschema@.expiry_bucket(expires_at)';
BEGIN
  IF pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL THEN
    EXECUTE 'SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition WHERE logicalrelid '
            'OPERATOR(pg_catalog.=) ''@extschema@.idempotency_keys''::pg_catalog.regclass)'
      INTO distributed;
  END IF;
  IF distributed THEN
    wanted := 'expires_at';
  END IF;
  IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 >= 160000 AND NOT EXISTS (
       SELECT FROM pg_catalog.pg_class i JOIN pg_catalog.pg_am a ON a.oid OPERATOR(pg_catalog.=) i.relam
                   JOIN pg_catalog.pg_index x ON x.indexrelid OPERATOR(pg_catalog.=) i.oid
        WHERE i.oid OPERATOR(pg_catalog.=) '@extschema@.idempotency_keys_expires_at_idx'::pg_catalog.regclass
          AND a.amname OPERATOR(pg_catalog.=) 'brin'
          AND (x.indexprs IS NOT NULL OR distributed)) THEN
    EXECUTE 'DROP INDEX @extschema@.idempotency_keys_expires_at_idx';
    EXECUTE 'CREATE INDEX idempotency_keys_expires_at_idx ON @extschema@.idempotency_keys '
            'USING brin (' OPERATOR(pg_catalog.||) wanted OPERATOR(pg_catalog.||) ')';
  END IF;
END
$$;
COMMENT ON INDEX @extschema@.idempotency_keys_expires_at_idx IS
  'Serves the cleanup''s scan for expired keys: a B-Tree on PostgreSQL 15, a BRIN over '
  'expiry_bucket(expires_at) on 16 and later, where a completion (which moves expires_at) '
  'then stays a HOT update.';
