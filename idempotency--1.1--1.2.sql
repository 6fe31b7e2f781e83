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

-------------------------------------------------------------------------------
-- Responses replayed as sent: body bytes, status and headers (section: responses)
-------------------------------------------------------------------------------

-- A response as the first request sent it, beside the jsonb response of 1.0: the body's bytes
-- (any content type, not necessarily UTF-8) and its headers; the status is response_code. Last
-- in the row, with the other columns a completion writes, so that its WAL record stays small.
-- One statement each, run by EXECUTE: Citus passes a DDL statement on to the shards as its own
-- text. Adding a column without a default rewrites nothing.
DO $$
BEGIN
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ADD COLUMN response_body pg_catalog.bytea';
  EXECUTE 'ALTER TABLE @extschema@.idempotency_keys ADD COLUMN response_headers pg_catalog.jsonb';
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
