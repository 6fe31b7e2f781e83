-- Portable edition 1.3.1 -> 1.3.2: the same promises for less work per call (issue #36).
-- Nothing of the table's rows changes: the update runs with keys in place and takes no longer
-- than its catalog changes.

-- This cluster's system identifier (the second half of a key's owner stamp), computed once per
-- plan. pg_control_system() reads and checks the control file at every call (about 9 µs on
-- the claim path, again in the policy's check of the insert); the identifier cannot change
-- while the server runs, and a plan lives no longer than its backend, so declaring the
-- function IMMUTABLE lets the planner compute it when it plans a statement (a PL/pgSQL
-- statement, a policy's check, a column default) and keep the value in the plan. Nothing of
-- it is stored: the value is always read from this server's control file, never from a table
-- that a restore could bring from another cluster, and no session setting can change it.
CREATE FUNCTION idempotency.system_identifier() RETURNS pg_catalog.int8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT s.system_identifier FROM pg_catalog.pg_control_system() s $$;
COMMENT ON FUNCTION idempotency.system_identifier() IS
  'Internal: this cluster''s system identifier (pg_control_system()), IMMUTABLE so that a plan '
  'computes it once: it cannot change while the server runs.';

-- A direct insert's stamp by default (the functions write it themselves).
ALTER TABLE idempotency.idempotency_keys
  ALTER COLUMN owner_system SET DEFAULT idempotency.system_identifier();

-- The bounds move from the table's CHECK into the policy's WITH CHECK. PostgreSQL 15 reads
-- and plans a table's CHECK again at every insert or update statement (about 15 µs of a new
-- key's claim); a policy's expressions are planned with the statement, once for the plan a
-- PL/pgSQL function keeps. Who is held to them: every role the policy applies to, that is
-- every role but the installing role (the table's owner, which can drop any constraint) and
-- the roles that bypass row-level security (superusers, BYPASSRLS), which read and write every
-- role's rows anyway; the functions hold every caller to the same bounds by their argument
-- checks. A role's direct write over a bound is refused with 42501 (a row the policy does not
-- admit) instead of 23514.
DROP POLICY own_keys ON idempotency.idempotency_keys;
CREATE POLICY own_keys ON idempotency.idempotency_keys
  USING (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text)
  WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text
              AND owner_oid OPERATOR(pg_catalog.=) pg_catalog.quote_ident(CURRENT_USER)::pg_catalog.regrole::pg_catalog.oid
              AND owner_system OPERATOR(pg_catalog.=) idempotency.system_identifier()
              -- The ceilings: the C++ edition's largest settings.
              AND pg_catalog.octet_length(key) OPERATOR(pg_catalog.<=) 1024
              AND key OPERATOR(pg_catalog.<>) ''
              AND pg_catalog.octet_length(scope) OPERATOR(pg_catalog.<=) 1024
              AND (fingerprint IS NULL OR pg_catalog.octet_length(fingerprint) OPERATOR(pg_catalog.<=) 1024)
              AND (recovery_point IS NULL OR pg_catalog.octet_length(recovery_point) OPERATOR(pg_catalog.<=) 1048576)
              AND COALESCE(pg_catalog.pg_column_size(response), 0)
                  OPERATOR(pg_catalog.+) COALESCE(pg_catalog.octet_length(response_body), 0)
                  OPERATOR(pg_catalog.+) COALESCE(pg_catalog.pg_column_size(response_headers), 0)
                  OPERATOR(pg_catalog.<=) 536870911
              AND attempts OPERATOR(pg_catalog.>=) 1);
COMMENT ON POLICY own_keys ON idempotency.idempotency_keys IS
  'A role reads, locks, changes and deletes only keys whose owner is its name (current_user), '
  'and writes rows only under its own stamp (its OID, this cluster) and within the ceilings of '
  'every stored value (the C++ edition''s largest settings). The functions also skip rows of '
  'its name stamped here by another role (an earlier role of that name): direct reads see '
  'them until the cleanup deletes them (SECURITY.md, "The portable edition").';
ALTER TABLE idempotency.idempotency_keys DROP CONSTRAINT idempotency_keys_bounded;

UPDATE idempotency.edition SET version = '1.3.2';
