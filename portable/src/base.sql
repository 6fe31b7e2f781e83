-- The portable edition of idempotency, version 1.2.0: schema, types, table, row-level
-- security and grants. SQL and PL/pgSQL only; installed by a role that is not a superuser
-- (the database owner, or a managed service's admin role), which then owns every object.
-- Every name is schema-qualified; the functions (functions.sql) pin search_path.

-- The schema is made here, by the installing role: a schema of this name made beforehand by
-- someone else is refused (42P06), so nobody else owns or writes in it.
CREATE SCHEMA idempotency;
COMMENT ON SCHEMA idempotency IS
  'Idempotency keys (portable edition, SQL and PL/pgSQL): GRANT USAGE ON SCHEMA idempotency TO a role lets it claim keys of its own.';
REVOKE ALL ON SCHEMA idempotency FROM PUBLIC;

-------------------------------------------------------------------------------
-- Types, as the C++ edition declares them
-------------------------------------------------------------------------------

CREATE TYPE idempotency.key_status AS ENUM ('processing', 'completed');
COMMENT ON TYPE idempotency.key_status IS
  'State of a stored idempotency key: processing (claimed, no outcome yet) or completed.';

CREATE TYPE idempotency.claim_status AS ENUM
  ('claimed', 'reclaimed', 'replay', 'mismatch', 'in_progress');
COMMENT ON TYPE idempotency.claim_status IS
  'What claim_key decided: claimed / reclaimed (do the work), replay (return the stored '
  'response), mismatch (same key, different request: reject, HTTP 422), in_progress '
  '(another caller holds the key: reject, HTTP 409 with Retry-After).';

CREATE TYPE idempotency.claim_result AS (
  status           idempotency.claim_status,
  token            pg_catalog.uuid,
  response         pg_catalog.jsonb,
  response_code    pg_catalog.int4,
  fingerprint      pg_catalog.bytea,
  recovery_point   pg_catalog.text,
  attempts         pg_catalog.int4,
  created_at       pg_catalog.timestamptz,
  expires_at       pg_catalog.timestamptz,
  retry_after      pg_catalog.interval,
  response_body    pg_catalog.bytea,
  response_headers pg_catalog.jsonb
);
COMMENT ON TYPE idempotency.claim_result IS
  'Result of claim_key and complete_key. token is set only for claimed / reclaimed; response, '
  'response_code, response_body and response_headers only for replay; retry_after only for '
  'in_progress.';

-------------------------------------------------------------------------------
-- The key table: the columns of the C++ edition's table (version 1.2), so that the rows of
-- one edition restore into the other (COPY names its columns).
-------------------------------------------------------------------------------

CREATE TABLE idempotency.idempotency_keys (
  owner            pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
  scope            pg_catalog.text COLLATE pg_catalog."C" NOT NULL DEFAULT '',
  key              pg_catalog.text COLLATE pg_catalog."C" NOT NULL,
  fingerprint      pg_catalog.bytea,
  attempts         pg_catalog.int4 NOT NULL DEFAULT 1,
  ttl              pg_catalog.interval NOT NULL,
  lease            pg_catalog.interval NOT NULL,
  created_at       pg_catalog.timestamptz NOT NULL,
  expires_at       pg_catalog.timestamptz NOT NULL,
  lease_token      pg_catalog.uuid,
  locked_until     pg_catalog.timestamptz,
  recovery_point   pg_catalog.text,
  status           idempotency.key_status NOT NULL DEFAULT 'processing',
  response_code    pg_catalog.int4,
  updated_at       pg_catalog.timestamptz NOT NULL,
  response         pg_catalog.jsonb,
  response_body    pg_catalog.bytea,
  response_headers pg_catalog.jsonb,
  -- The owner stamp (owner_oid, owner_system) of issue #32 is added by update-1.2.1--1.3.0.sql,
  -- last, as the C++ edition's 1.3 adds it.
  PRIMARY KEY (key, scope, owner),
  -- Hard ceilings, whatever a session sets: the C++ edition's largest settings. They bound
  -- what a role can store through the functions and by writing its own rows directly.
  CONSTRAINT idempotency_keys_bounded CHECK (
    pg_catalog.octet_length(key) BETWEEN 1 AND 1024
    AND pg_catalog.octet_length(scope) <= 1024
    AND pg_catalog.octet_length(owner) <= 64
    AND (fingerprint IS NULL OR pg_catalog.octet_length(fingerprint) <= 1024)
    AND (recovery_point IS NULL OR pg_catalog.octet_length(recovery_point) <= 1048576)
    AND COALESCE(pg_catalog.pg_column_size(response), 0)
        + COALESCE(pg_catalog.octet_length(response_body), 0)
        + COALESCE(pg_catalog.pg_column_size(response_headers), 0) <= 536870911
    AND attempts >= 1)
) WITH (
  fillfactor = 90,
  autovacuum_vacuum_scale_factor = 0.02,
  autovacuum_vacuum_insert_scale_factor = 0.05,
  autovacuum_analyze_scale_factor = 0.05
);
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency.idempotency_keys (expires_at);

COMMENT ON TABLE idempotency.idempotency_keys IS
  'One row per (owner, scope, key): the claim, its lease and the stored outcome. Row-level '
  'security: a role sees and writes only rows whose owner is its own name (current_user).';
COMMENT ON COLUMN idempotency.idempotency_keys.owner IS
  'Name of the role that claimed the key (current_user at the call) and part of its identity.';
COMMENT ON COLUMN idempotency.idempotency_keys.scope IS 'Namespace of the key (tenant, API key, endpoint); '''' by default.';
COMMENT ON COLUMN idempotency.idempotency_keys.key IS 'The client''s idempotency key (at most idempotency.max_key_length bytes).';
COMMENT ON COLUMN idempotency.idempotency_keys.fingerprint IS 'Digest of the request payload; NULL = not checked.';
COMMENT ON COLUMN idempotency.idempotency_keys.attempts IS 'How many times the key was claimed (1 + reclaims).';
COMMENT ON COLUMN idempotency.idempotency_keys.ttl IS 'How long the key is kept, counted from completion.';
COMMENT ON COLUMN idempotency.idempotency_keys.lease IS 'The lease the claim was made with; checkpoint_key renews by it when given no lease.';
COMMENT ON COLUMN idempotency.idempotency_keys.created_at IS 'When the key was first claimed.';
COMMENT ON COLUMN idempotency.idempotency_keys.expires_at IS 'After this time the key counts as absent and the cleanup deletes it.';
COMMENT ON COLUMN idempotency.idempotency_keys.lease_token IS 'Fencing token (UUIDv7) of the current holder; NULL once released.';
COMMENT ON COLUMN idempotency.idempotency_keys.locked_until IS 'End of the current holder''s lease.';
COMMENT ON COLUMN idempotency.idempotency_keys.recovery_point IS 'Last checkpoint of a multi-step handler.';
COMMENT ON COLUMN idempotency.idempotency_keys.status IS 'processing or completed.';
COMMENT ON COLUMN idempotency.idempotency_keys.response_code IS 'Stored outcome code (for example an HTTP status).';
COMMENT ON COLUMN idempotency.idempotency_keys.updated_at IS 'Last change of the row.';
COMMENT ON COLUMN idempotency.idempotency_keys.response IS 'Stored outcome replayed to duplicates.';
COMMENT ON COLUMN idempotency.idempotency_keys.response_body IS
  'Stored response body, the bytes exactly as sent, replayed byte for byte; NULL = none.';
COMMENT ON COLUMN idempotency.idempotency_keys.response_headers IS
  'Stored response headers: a JSON object whose values are strings or arrays of strings; NULL = none.';
COMMENT ON INDEX idempotency.idempotency_keys_expires_at_idx IS 'Serves the cleanup''s scan for expired keys.';
COMMENT ON CONSTRAINT idempotency_keys_bounded ON idempotency.idempotency_keys IS
  'Hard ceilings of every stored value (the C++ edition''s largest settings), whatever a session sets.';

-- Per-role keys: the functions run as their caller, who reaches only rows of its own name.
-- The installing role owns the table and is not subject to the policy (it runs the cleanup);
-- superusers bypass row-level security anyway. Every role with USAGE on the schema may read
-- and write its own rows, and nothing else: no TRUNCATE, TRIGGER or REFERENCES.
ALTER TABLE idempotency.idempotency_keys ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_keys ON idempotency.idempotency_keys
  USING (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text)
  WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text);
COMMENT ON POLICY own_keys ON idempotency.idempotency_keys IS
  'A role reads, locks, changes and deletes only keys whose owner is its name (current_user).';
REVOKE ALL ON TABLE idempotency.idempotency_keys FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE idempotency.idempotency_keys TO PUBLIC;

-- The secret of each role's key locks. An open claim is told apart by a transaction-level
-- advisory lock whose tag is a keyed hash of (owner, scope, key); pg_locks shows every lock to
-- every role, so the key is each role's own secret, which only that role (and the installer)
-- can read: another role can neither compute the tag of a key it guesses nor take it.
CREATE TABLE idempotency.role_secrets (
  owner  pg_catalog.text COLLATE pg_catalog."C" PRIMARY KEY DEFAULT CURRENT_USER,
  secret pg_catalog.bytea NOT NULL
    DEFAULT pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::pg_catalog.text
            OPERATOR(pg_catalog.||) pg_catalog.gen_random_uuid()::pg_catalog.text, '-', ''), 'hex')
    CHECK (pg_catalog.octet_length(secret) = 32)
);
COMMENT ON TABLE idempotency.role_secrets IS
  'One random secret per role, mixed into the tags of its key locks so that pg_locks reveals no key. '
  'Row-level security: a role reads only its own.';
COMMENT ON COLUMN idempotency.role_secrets.owner IS 'Name of the role.';
COMMENT ON COLUMN idempotency.role_secrets.secret IS '32 random bytes (from gen_random_uuid, a CSPRNG).';
ALTER TABLE idempotency.role_secrets ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_secret ON idempotency.role_secrets
  USING (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text)
  WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text);
COMMENT ON POLICY own_secret ON idempotency.role_secrets IS 'A role sees and makes only its own secret.';
REVOKE ALL ON TABLE idempotency.role_secrets FROM PUBLIC;
GRANT SELECT, INSERT ON TABLE idempotency.role_secrets TO PUBLIC;
-- Secrets of the roles that exist now: their first claims then never meet on this table.
INSERT INTO idempotency.role_secrets (owner)
  SELECT rolname FROM pg_catalog.pg_roles WHERE rolname OPERATOR(pg_catalog.!~) '^pg_';

-- The installed version, for the update steps of the one-file install.
CREATE TABLE idempotency.edition (
  name    pg_catalog.text NOT NULL,
  version pg_catalog.text NOT NULL
);
INSERT INTO idempotency.edition VALUES ('portable', '1.2.0');
COMMENT ON TABLE idempotency.edition IS 'Which edition of idempotency is installed here, and its version.';
REVOKE ALL ON TABLE idempotency.edition FROM PUBLIC;
GRANT SELECT ON TABLE idempotency.edition TO PUBLIC;
