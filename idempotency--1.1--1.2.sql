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
-- it. Keys of roles dropped before the update have no name to keep: they are deleted.
DELETE FROM @extschema@.idempotency_keys k
 WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles r
                    WHERE r.oid OPERATOR(pg_catalog.=) k.owner::pg_catalog.oid);

-- The primary key becomes (key, scope, owner): descents compare the key first (read at a fixed
-- offset, as 1.1 did after its fixed-width owner), and the owner, now a name, comes last.
-- Three statements, each run by EXECUTE: Citus passes a DDL statement on to the shards as its
-- own text, and refuses ADD CONSTRAINT beside another subcommand. The column change rewrites
-- the table under its ACCESS EXCLUSIVE lock (seconds per million keys).
DO $$
BEGIN
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys DROP CONSTRAINT idempotency_keys_pkey';
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ALTER COLUMN owner TYPE pg_catalog.text '
          'COLLATE pg_catalog."C" USING pg_catalog.pg_get_userbyid(owner::pg_catalog.oid)::pg_catalog.text';
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

-------------------------------------------------------------------------------
-- Security checks (section: security)
-------------------------------------------------------------------------------
