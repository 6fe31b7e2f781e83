-- Portable edition 1.2.0 -> 1.2.1: what can be had instead of the C++ edition's shared-memory
-- statistics: counts computed from the table, for monitoring roles.

-- Without IF NOT EXISTS: a schema of this name made by someone else beforehand makes the
-- install fail instead of handing over a schema its maker controls.
CREATE SCHEMA idempotency_monitor;
COMMENT ON SCHEMA idempotency_monitor IS
  'Counts of the keys of idempotency (portable edition) for monitoring roles: pg_monitor has '
  'USAGE here and SELECT on key_counts, and nothing in schema idempotency.';
REVOKE ALL ON SCHEMA idempotency_monitor FROM PUBLIC;

-- The view reads the table with its owner's rights (the installing role, which row-level
-- security does not restrict): counts and ages of every role's keys, never a key or a response.
CREATE VIEW idempotency_monitor.key_counts AS
  SELECT pg_catalog.current_database() AS datname,
         pg_catalog.count(*) FILTER (WHERE t.status OPERATOR(pg_catalog.=) 'processing'
                                       AND t.lease_token IS NOT NULL AND t.locked_until OPERATOR(pg_catalog.>) pg_catalog.now()
                                       AND t.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) AS processing,
         pg_catalog.count(*) FILTER (WHERE t.status OPERATOR(pg_catalog.=) 'processing'
                                       AND (t.lease_token IS NULL OR t.locked_until OPERATOR(pg_catalog.<=) pg_catalog.now())
                                       AND t.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) AS reclaimable,
         pg_catalog.count(*) FILTER (WHERE t.status OPERATOR(pg_catalog.=) 'completed'
                                       AND t.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) AS completed,
         pg_catalog.count(*) FILTER (WHERE t.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now()) AS expired_not_deleted,
         pg_catalog.count(*) FILTER (WHERE t.attempts OPERATOR(pg_catalog.>) 1) AS reclaimed_at_least_once,
         pg_catalog.max(pg_catalog.now() OPERATOR(pg_catalog.-) t.created_at)
           FILTER (WHERE t.status OPERATOR(pg_catalog.=) 'processing'
                     AND t.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()) AS oldest_processing_age,
         pg_catalog.count(DISTINCT t.owner) AS roles
    FROM idempotency.idempotency_keys t;
COMMENT ON VIEW idempotency_monitor.key_counts IS
  'Keys of this database by state, computed from the table at each query (the portable '
  'edition has no shared-memory statistics): live claims, reclaimable ones, completed, expired '
  'and not yet deleted, reclaimed at least once, the age of the oldest live claim, and how many roles.';
REVOKE ALL ON idempotency_monitor.key_counts FROM PUBLIC;
GRANT USAGE ON SCHEMA idempotency_monitor TO pg_monitor;
GRANT SELECT ON idempotency_monitor.key_counts TO pg_monitor;

UPDATE idempotency.edition SET version = '1.2.1';
