-- Portable edition 1.3.0 -> 1.3.1: the key's life cycle of the C++ edition's 1.3 (issue #37):
-- look_key, forget_key, key_policy (functions.sql), complete_key's response_ttl with
-- claim_result.response_dropped, and the stuck-holders view. The table already has
-- response_expires_at (1.3.0); from here this edition sets it and its cleanup drops responses
-- past it.

-- The C++ edition's 1.3 field, last, so that code reading either edition's answer reads both.
ALTER TYPE idempotency.claim_result ADD ATTRIBUTE response_dropped pg_catalog.bool;
COMMENT ON TYPE idempotency.claim_result IS
  'Result of claim_key, complete_key and look_key. token is set only for claimed / reclaimed '
  'made by claim_key (look_key''s claimed / reclaimed carry none: nothing was claimed); '
  'response, response_code, response_body and response_headers only for replay; retry_after '
  'only for in_progress; response_dropped only for replay: true when the response was dropped '
  'after complete_key''s response_ttl (response, body and headers NULL, response_code kept).';

-- complete_key gains response_ttl, last and with a default (functions.sql makes it again): the
-- 1.3.0 signature goes, or a call by position would find two functions. IF EXISTS: a fresh
-- install runs this step before functions.sql has made any function.
DROP FUNCTION IF EXISTS idempotency.complete_key(pg_catalog.text, pg_catalog.uuid, pg_catalog.jsonb,
                                                 pg_catalog.int4, pg_catalog.text, pg_catalog.bytea,
                                                 pg_catalog.jsonb);

COMMENT ON COLUMN idempotency.idempotency_keys.response_expires_at IS
  'When the stored response (response, response_body, response_headers) stops being replayed '
  'and the cleanup drops it (complete_key''s response_ttl); the key stays until expires_at. '
  'NULL: the response lives as long as the key.';

-- Stuck holders: per role and scope of this database, the claims whose lease runs and those
-- whose lease ended with no one taking the key over (a handler that died, or hangs past its
-- lease); counts and ages only, no key, response or token. The view reads the table with its
-- owner's rights (the installing role, which row-level security does not restrict), as
-- key_counts does; it reads the whole table (a sequential scan): a query for an operator.
-- Computed from the table as the C++ edition's view is, so both show the same rows.
CREATE VIEW idempotency.stuck_holders AS
  SELECT pg_catalog.current_database() AS datname,
         t.owner::pg_catalog.text AS role,
         t.scope::pg_catalog.text AS scope,
         pg_catalog.count(*) FILTER (WHERE t.locked_until OPERATOR(pg_catalog.>) pg_catalog.now()) AS processing,
         pg_catalog.now() OPERATOR(pg_catalog.-) pg_catalog.min(t.created_at) AS oldest_claim_age,
         pg_catalog.count(*) FILTER (WHERE t.locked_until OPERATOR(pg_catalog.<=) pg_catalog.now()) AS leases_ended
    FROM idempotency.idempotency_keys t
   WHERE t.status OPERATOR(pg_catalog.=) 'processing' AND t.lease_token IS NOT NULL
     AND t.expires_at OPERATOR(pg_catalog.>) pg_catalog.now()
   GROUP BY t.owner, t.scope;
COMMENT ON VIEW idempotency.stuck_holders IS
  'Claims held now, per role (the key''s owner name) and scope of this database: processing '
  '(live leases), oldest_claim_age (since the oldest of these claims was first made) and '
  'leases_ended (leases that ended with no one taking the key over: a crashed or hung '
  'handler; the next claim_key reclaims them). Released and expired keys are not counted. No '
  'key values, responses or tokens. Reads the whole key table. For the installing role and '
  'superusers; monitoring roles read idempotency_monitor.stuck_holders.';
CREATE VIEW idempotency_monitor.stuck_holders AS
  SELECT * FROM idempotency.stuck_holders;
COMMENT ON VIEW idempotency_monitor.stuck_holders IS
  'idempotency.stuck_holders for monitoring roles (members of pg_monitor).';

-- Default privileges of the installing role (ALTER DEFAULT PRIVILEGES ... ON TABLES) may have
-- granted rights on the new views: nobody but their owner keeps one; the grant meant follows.
DO $revoke$
DECLARE
  item record;
BEGIN
  FOR item IN
    SELECT c.oid::pg_catalog.regclass::pg_catalog.text AS name, a.grantee
      FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
     WHERE c.oid OPERATOR(pg_catalog.=) ANY (ARRAY['idempotency.stuck_holders'::pg_catalog.regclass,
             'idempotency_monitor.stuck_holders'::pg_catalog.regclass]::pg_catalog.oid[])
       AND a.grantee OPERATOR(pg_catalog.<>) c.relowner
  LOOP
    EXECUTE pg_catalog.format('REVOKE ALL ON TABLE %s FROM %s', item.name,
      CASE WHEN item.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
           ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(item.grantee)) END);
  END LOOP;
END
$revoke$;
REVOKE ALL ON idempotency.stuck_holders FROM PUBLIC;
REVOKE ALL ON idempotency_monitor.stuck_holders FROM PUBLIC;
GRANT SELECT ON idempotency_monitor.stuck_holders TO pg_monitor;

UPDATE idempotency.edition SET version = '1.3.1';
