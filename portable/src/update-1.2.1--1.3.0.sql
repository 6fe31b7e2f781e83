-- Portable edition 1.2.1 -> 1.3.0: a key's owner is a principal, not only a name (issue #32),
-- as in the C++ edition's 1.3: each row also carries the stamp of the role that wrote it, its
-- OID and the system identifier of the cluster it was written in. The name stays the key's
-- identity (the primary key is unchanged); in the cluster that stamped it, a row answers only
-- the role of that name and that OID; a row stamped elsewhere, or not stamped, is adopted by
-- name (as pg_dump matches the owners of objects) until the cleanup stamps it. The columns
-- are those of the C++ edition, added last as there, so that dumps move both ways.
ALTER TABLE idempotency.idempotency_keys ADD COLUMN owner_oid pg_catalog.oid;
ALTER TABLE idempotency.idempotency_keys ADD COLUMN owner_system pg_catalog.int8;

COMMENT ON COLUMN idempotency.idempotency_keys.owner IS
  'Name of the role that claimed the key (current_user at the call) and part of its identity: '
  'the key answers only a role of this name, and in the cluster that stamped it (owner_oid, '
  'owner_system) only the role of that OID. Keys of dropped or renamed roles are deleted by the cleanup.';
COMMENT ON COLUMN idempotency.idempotency_keys.owner_oid IS
  'OID of the role that claimed the key, in the cluster owner_system names; NULL: not stamped '
  '(adopted by name). A role of the same name with another OID never reads, completes or holds the key.';
COMMENT ON COLUMN idempotency.idempotency_keys.owner_system IS
  'System identifier (pg_control_system()) of the cluster whose role owner_oid is; a row from '
  'another cluster (restored, replicated) is adopted by the role of its owner name, and '
  'stamped by the cleanup. NULL: not stamped.';

-- The keys in place were written here by the role that has their name now, or by a role since
-- dropped: each row whose name names a role is stamped with that role's OID, the rest deleted.
UPDATE idempotency.idempotency_keys k
   SET owner_oid = r.oid,
       owner_system = (SELECT s.system_identifier FROM pg_catalog.pg_control_system() s)
  FROM pg_catalog.pg_roles r
 WHERE r.rolname OPERATOR(pg_catalog.=) k.owner;
DELETE FROM idempotency.idempotency_keys WHERE owner_oid IS NULL;

-- A row written by a role, through the functions or directly, carries that role's own stamp:
-- no role can leave behind a row that a later role of its name would adopt. The defaults make
-- a role's direct INSERT stamped without naming the columns.
ALTER TABLE idempotency.idempotency_keys
  ALTER COLUMN owner_oid SET DEFAULT pg_catalog.quote_ident(CURRENT_USER)::pg_catalog.regrole::pg_catalog.oid,
  ALTER COLUMN owner_system SET DEFAULT (pg_catalog.pg_control_system()).system_identifier;
DROP POLICY own_keys ON idempotency.idempotency_keys;
CREATE POLICY own_keys ON idempotency.idempotency_keys
  USING (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text)
  WITH CHECK (owner OPERATOR(pg_catalog.=) CURRENT_USER::pg_catalog.text
              AND owner_oid OPERATOR(pg_catalog.=) pg_catalog.quote_ident(CURRENT_USER)::pg_catalog.regrole::pg_catalog.oid
              AND owner_system OPERATOR(pg_catalog.=) (pg_catalog.pg_control_system()).system_identifier);
COMMENT ON POLICY own_keys ON idempotency.idempotency_keys IS
  'A role reads, locks, changes and deletes only keys whose owner is its name (current_user), '
  'and writes rows only under its own stamp (its OID, this cluster). The functions also skip '
  'rows of its name stamped here by another role (an earlier role of that name): direct reads '
  'see them until the cleanup deletes them (SECURITY.md, "The portable edition").';

-- The C++ edition's 1.3 column of tombstones (complete_key's response_ttl), so that its dumps
-- restore here: this edition does not set it yet (issue of the life-cycle functions), and it
-- replays no response of a row whose response_expires_at has passed (stored_answer).
ALTER TABLE idempotency.idempotency_keys ADD COLUMN response_expires_at pg_catalog.timestamptz;
COMMENT ON COLUMN idempotency.idempotency_keys.response_expires_at IS
  'When the stored response (response, response_body, response_headers) stops being replayed '
  '(the C++ edition''s complete_key response_ttl); the key stays until expires_at. NULL: the '
  'response lives as long as the key.';

UPDATE idempotency.edition SET version = '1.3.0';
