-- Portable edition 1.3.2 -> 1.3.3: the same promises for less work per call (issue #36, the
-- hand-written claim of the same checks as the yardstick). Nothing of the table's rows
-- changes: the update runs with keys in place and takes no longer than its catalog changes.
-- The functions (functions.sql, run after this) name the owner as the policy does, so that a
-- statement has no gate node for two equal conditions, and complete_key returns only its
-- answer's fields.

-- The policy's WITH CHECK holds the same rows to the same ceilings with fewer function calls:
-- PostgreSQL looks up each function of a policy's expression and checks its EXECUTE privilege
-- again at every insert or update statement (a claim's insert, a completion's update). The
-- three names' ceiling is one GREATEST (which skips a NULL fingerprint), the recovery point's
-- a COALESCE (a NULL passes, as before).
DROP POLICY own_keys ON idempotency.idempotency_keys;
CREATE POLICY own_keys ON idempotency.idempotency_keys
  USING (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text)
  WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text
              AND owner_oid OPERATOR(pg_catalog.=) pg_catalog.quote_ident(CURRENT_USER)::pg_catalog.regrole::pg_catalog.oid
              AND owner_system OPERATOR(pg_catalog.=) idempotency.system_identifier()
              -- The ceilings: the C++ edition's largest settings.
              AND key OPERATOR(pg_catalog.<>) ''
              AND GREATEST(pg_catalog.octet_length(key), pg_catalog.octet_length(scope),
                           pg_catalog.octet_length(fingerprint)) OPERATOR(pg_catalog.<=) 1024
              AND COALESCE(pg_catalog.octet_length(recovery_point), 0) OPERATOR(pg_catalog.<=) 1048576
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

UPDATE idempotency.edition SET version = '1.3.3';
