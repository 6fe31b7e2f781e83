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
