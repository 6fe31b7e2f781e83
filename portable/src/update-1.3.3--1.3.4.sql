-- Portable edition 1.3.3 -> 1.3.4: a completion writes no index entry on PostgreSQL 16 and
-- later (issue #36, claim + complete against the hand-written claim of the same checks). The
-- C++ edition's layout of the expiry index, for the same reason (docs/design.md, "The expiry
-- index"): a completion moves expires_at (ttl counts from the completion), and under a B-Tree
-- on it no completion is a HOT update, so each completed key costs two more index entries (the
-- primary key's included) and their WAL. PostgreSQL 16 and later keep an update HOT when only
-- summarizing (BRIN) indexes cover the changed columns, so there the index becomes a BRIN;
-- PostgreSQL 15 keeps the B-Tree. The BRIN is over expires_at rounded down to its minute: time
-- only moves forward, so nearly every new expiry would lie past its range's maximum and widen
-- the summary (a WAL record per claim and per completion); keys written within a minute share
-- a value the summary already holds. The rows do not change; the update rebuilds the index
-- with keys in place (one pass over the table).

CREATE FUNCTION idempotency.expiry_bucket(expires_at pg_catalog.timestamptz)
RETURNS pg_catalog.timestamptz
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN pg_catalog.date_bin('1 minute'::pg_catalog.interval, expires_at,
                           '2000-01-01 00:00:00+00'::pg_catalog.timestamptz);
COMMENT ON FUNCTION idempotency.expiry_bucket(timestamptz) IS
  'expires_at rounded down to its minute (infinity stays), as the C++ edition''s: the key of '
  'the expiry index on PostgreSQL 16 and later. Never later than expires_at.';

DO $$
BEGIN
  IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 >= 160000 THEN
    DROP INDEX idempotency.idempotency_keys_expires_at_idx;
    CREATE INDEX idempotency_keys_expires_at_idx ON idempotency.idempotency_keys
      USING brin (idempotency.expiry_bucket(expires_at));
  END IF;
END
$$;
COMMENT ON INDEX idempotency.idempotency_keys_expires_at_idx IS
  'The index on expires_at: a B-Tree on PostgreSQL 15, a BRIN over expiry_bucket(expires_at) on '
  '16 and later, where a completion (which moves expires_at) then stays a HOT update.';

UPDATE idempotency.edition SET version = '1.3.4';
