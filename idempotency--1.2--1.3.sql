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
