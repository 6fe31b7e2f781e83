-- idempotency 1.0: idempotency keys that live beside the business data.
-- Every object is created in the extension's schema (@extschema@); the C++ code finds its
-- table through that schema, never through search_path.

\echo Use "CREATE EXTENSION idempotency" to load this file. \quit

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
CREATE TABLE @extschema@.idempotency_keys (
  scope          text COLLATE "C" NOT NULL DEFAULT '',
  key            text COLLATE "C" NOT NULL,
  owner          regrole NOT NULL,
  fingerprint    bytea,
  attempts       integer NOT NULL DEFAULT 1,
  ttl            interval NOT NULL,
  created_at     timestamptz NOT NULL,
  expires_at     timestamptz NOT NULL,
  lease_token    uuid,
  locked_until   timestamptz,
  recovery_point text,
  status         @extschema@.key_status NOT NULL DEFAULT 'processing',
  response_code  integer,
  updated_at     timestamptz NOT NULL,
  response       jsonb,
  PRIMARY KEY (scope, key)
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
  'One row per (scope, key): the claim, its lease and the stored outcome. Reached only '
  'through claim_key / complete_key / release_key / checkpoint_key.';
COMMENT ON COLUMN @extschema@.idempotency_keys.scope IS 'Namespace of the key (tenant, API key, endpoint); '''' by default.';
COMMENT ON COLUMN @extschema@.idempotency_keys.key IS 'The client''s idempotency key (at most idempotency.max_key_length bytes).';
COMMENT ON COLUMN @extschema@.idempotency_keys.owner IS 'Role that claimed the key (regrole: pg_dump writes its name, so a restore maps it to the same role in another cluster); other roles get SQLSTATE 42501.';
COMMENT ON COLUMN @extschema@.idempotency_keys.fingerprint IS 'Digest of the request payload; NULL = not checked.';
COMMENT ON COLUMN @extschema@.idempotency_keys.attempts IS 'How many times the key was claimed (1 + reclaims).';
COMMENT ON COLUMN @extschema@.idempotency_keys.ttl IS 'How long the key is kept, counted from completion.';
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

-- pg_dump keeps the rows: a dump and restore loses no key.
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_keys', '');

-- Applications reach the rows only through the functions below.
REVOKE ALL ON TABLE @extschema@.idempotency_keys FROM PUBLIC;

-------------------------------------------------------------------------------
-- The claim protocol (SECURITY DEFINER: the caller needs no right on the table; the
-- C++ code schema-qualifies every name and operator, so the caller's search_path is
-- never consulted)
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
LANGUAGE C VOLATILE SECURITY DEFINER PARALLEL UNSAFE;
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
LANGUAGE C VOLATILE SECURITY DEFINER PARALLEL UNSAFE;
COMMENT ON FUNCTION @extschema@.complete_key(text, uuid, jsonb, integer, text) IS
  'Stores the outcome of a claim held with `token`; duplicates then get replay. Fenced: '
  'a token that no longer holds the key is rejected (55000).';

CREATE FUNCTION @extschema@.release_key(key text, token uuid, scope text DEFAULT '')
RETURNS void
AS 'MODULE_PATHNAME', 'release_key'
LANGUAGE C VOLATILE SECURITY DEFINER PARALLEL UNSAFE;
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
LANGUAGE C VOLATILE SECURITY DEFINER PARALLEL UNSAFE;
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
LANGUAGE C VOLATILE SECURITY DEFINER PARALLEL UNSAFE;
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
GRANT EXECUTE ON FUNCTION @extschema@.idempotency_stats_rows() TO pg_monitor;
GRANT SELECT ON @extschema@.idempotency_stats TO pg_monitor;
