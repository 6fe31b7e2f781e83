-- pgTAP: the two paths write identical rows (issue #25, "one definition of the row"). The
-- same calls are made once on the direct path and once with idempotency.executor_path on
-- (the executor's INSERT .. ON CONFLICT and UPDATEs), on keys that differ only in a prefix;
-- every stored column must then be equal between the two, times compared by what the
-- protocol fixes (the distance of expires_at and locked_until from the time of the write
-- that set them: updated_at, or created_at for the lease of a completed claim) and tokens by
-- whether there is one. Covers a new claim, the inbox completion (claim and
-- complete in one transaction: the direct path updates the row it inserted, by its
-- address), the two-phase completion, the response as sent, release, checkpoint, reclaim
-- after a release and the restart of an expired key.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(12);

-- The calls of one path, on keys PREFIX-...
CREATE FUNCTION pg_temp.calls(prefix text) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  t uuid;
BEGIN
  -- A new claim, left open.
  PERFORM idempotency.claim_key(prefix || '-new', '\x01'::bytea, ttl => '1 hour'::interval,
                                lease => '5 min'::interval);
  -- Inbox: claim and complete in this transaction (own claim, found by its address).
  SELECT token INTO t FROM idempotency.claim_key(prefix || '-inbox', '\x02'::bytea,
                                                 ttl => '2 hours'::interval);
  PERFORM idempotency.complete_key(prefix || '-inbox', t, '{"b": 2, "a": [1, {"c": null}]}'::jsonb,
                                   201);
  -- The response as sent, in the same transaction.
  SELECT token INTO t FROM idempotency.claim_key(prefix || '-sent', NULL::bytea);
  PERFORM idempotency.complete_key(prefix || '-sent', t, NULL::jsonb, 302,
                                   response_body => '\x00ff0d0a'::bytea,
                                   response_headers => '{"Location": "/p/7", "Vary": ["A", "B"]}'::jsonb);
  -- Release, then reclaim (attempts 2, the fingerprint kept).
  SELECT token INTO t FROM idempotency.claim_key(prefix || '-released', '\x03'::bytea);
  PERFORM idempotency.release_key(prefix || '-released', t);
  PERFORM idempotency.claim_key(prefix || '-reclaimed', '\x04'::bytea);
  SELECT token INTO t FROM idempotency.claim_key(prefix || '-reclaimed', '\x04'::bytea);
  -- Checkpoint with a recovery point and a new lease.
  SELECT token INTO t FROM idempotency.claim_key(prefix || '-checkpoint', ttl => '1 min'::interval,
                                                 lease => '1 min'::interval);
  PERFORM idempotency.checkpoint_key(prefix || '-checkpoint', t, 'step 3',
                                     lease => '7 min'::interval);
END$$;

-- Same for a key whose first claim expired: claimed with a tiny ttl and lease, then again.
CREATE FUNCTION pg_temp.expired_first(prefix text) RETURNS void LANGUAGE sql AS $$
  SELECT idempotency.claim_key(prefix || '-restart', '\x05'::bytea, ttl => '10 ms'::interval,
                               lease => '10 ms'::interval);
$$;
CREATE FUNCTION pg_temp.restart(prefix text) RETURNS void LANGUAGE sql AS $$
  SELECT idempotency.claim_key(prefix || '-restart', '\x06'::bytea, ttl => '3 hours'::interval);
$$;

-- A release before a reclaim must be its own statement: the reclaim of '-released' is made
-- in the next transaction, so that both paths take the key over the same way.
CREATE FUNCTION pg_temp.reclaim_released(prefix text) RETURNS void LANGUAGE sql AS $$
  SELECT idempotency.claim_key(prefix || '-released', '\x03'::bytea);
$$;

-- The two-phase completion: the claim commits first.
CREATE FUNCTION pg_temp.two_phase_claim(prefix text) RETURNS void LANGUAGE sql AS $$
  SELECT idempotency.claim_key(prefix || '-twophase', '\x07'::bytea, ttl => '4 hours'::interval);
$$;
CREATE FUNCTION pg_temp.two_phase_complete(prefix text) RETURNS void LANGUAGE sql AS $$
  SELECT idempotency.complete_key(k.key, k.lease_token, '[1, 2]'::jsonb, 200)
    FROM idempotency.idempotency_keys k WHERE k.key = prefix || '-twophase';
$$;

-- Runs pg_temp.STEP(prefix) on the path of the prefix: 'd' direct, 'e' the executor.
CREATE FUNCTION pg_temp.on_path(prefix text, step text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  PERFORM set_config('idempotency.executor_path', CASE prefix WHEN 'e' THEN 'on' ELSE 'off' END, true);
  EXECUTE format('SELECT pg_temp.%I($1)', step) USING prefix;
  PERFORM set_config('idempotency.executor_path', 'off', true);
END$$;

-- Each step on both paths, a transaction per step.
SELECT pg_temp.on_path(p, 'calls') FROM (VALUES ('d'), ('e')) v(p);
SELECT pg_temp.on_path(p, 'expired_first') FROM (VALUES ('d'), ('e')) v(p);
SELECT pg_temp.on_path(p, 'two_phase_claim') FROM (VALUES ('d'), ('e')) v(p);
SELECT pg_sleep(0.05);
SELECT pg_temp.on_path(p, 'restart') FROM (VALUES ('d'), ('e')) v(p);
SELECT pg_temp.on_path(p, 'reclaim_released') FROM (VALUES ('d'), ('e')) v(p);
SELECT pg_temp.on_path(p, 'two_phase_complete') FROM (VALUES ('d'), ('e')) v(p);

-- A row as the protocol fixes it, without the prefix of its key.
CREATE TEMP VIEW stored AS
  SELECT left(key, 1) AS path, substr(key, 3) AS name, scope, owner, fingerprint, attempts, ttl,
         lease, status::text AS status, response_code, response::text AS response, response_body,
         response_headers::text AS response_headers, recovery_point,
         lease_token IS NOT NULL AS has_token, expires_at - updated_at AS expires_after,
         locked_until - CASE WHEN status = 'completed' THEN created_at ELSE updated_at END AS locked_for
    FROM idempotency.idempotency_keys
   WHERE key ~ '^[de]-';

SELECT is((SELECT count(*)::int FROM stored WHERE path = 'd'), 8, 'the direct path wrote 8 keys');
SELECT is((SELECT count(*)::int FROM stored WHERE path = 'e'), 8, 'the executor path wrote 8 keys');
SELECT is(
  (SELECT string_agg(name, ', ' ORDER BY name) FROM
     ((SELECT name, scope, owner, fingerprint, attempts, ttl, lease, status, response_code, response,
              response_body, response_headers, recovery_point, has_token, expires_after, locked_for
         FROM stored WHERE path = 'd'
       EXCEPT
       SELECT name, scope, owner, fingerprint, attempts, ttl, lease, status, response_code, response,
              response_body, response_headers, recovery_point, has_token, expires_after, locked_for
         FROM stored WHERE path = 'e')
      UNION
      (SELECT name, scope, owner, fingerprint, attempts, ttl, lease, status, response_code, response,
              response_body, response_headers, recovery_point, has_token, expires_after, locked_for
         FROM stored WHERE path = 'e'
       EXCEPT
       SELECT name, scope, owner, fingerprint, attempts, ttl, lease, status, response_code, response,
              response_body, response_headers, recovery_point, has_token, expires_after, locked_for
         FROM stored WHERE path = 'd')) differing),
  NULL, 'every key has the same stored row on both paths');

-- What each call stored, on the direct path (so that "the same" is also the right thing).
SELECT is((SELECT format('%s %s %s %s %s', status, attempts, has_token, expires_after, locked_for)
             FROM stored WHERE path = 'd' AND name = 'new'),
          'processing 1 t 01:00:00 00:05:00', 'a new claim: processing, ttl and lease from its time');
SELECT is((SELECT format('%s %s %s %s %s', status, response_code, response, expires_after, has_token)
             FROM stored WHERE path = 'd' AND name = 'inbox'),
          'completed 201 {"a": [1, {"c": null}], "b": 2} 02:00:00 t',
          'inbox: completed, expiring ttl after the completion');
SELECT is((SELECT format('%s %s %s %s', response_code, response_body, response_headers, response IS NULL)
             FROM stored WHERE path = 'd' AND name = 'sent'),
          '302 \x00ff0d0a {"Vary": ["A", "B"], "Location": "/p/7"} t', 'the response as sent, stored');
SELECT is((SELECT format('%s %s %s', status, attempts, fingerprint)
             FROM stored WHERE path = 'd' AND name = 'released'),
          'processing 2 \x03', 'released, then reclaimed: attempts 2');
SELECT is((SELECT format('%s %s %s', attempts, fingerprint, has_token)
             FROM stored WHERE path = 'd' AND name = 'reclaimed'),
          '1 \x04 t', 'a second claim of an open claim of this transaction leaves it as it was');
SELECT is((SELECT format('%s %s %s', recovery_point, locked_for, lease)
             FROM stored WHERE path = 'd' AND name = 'checkpoint'),
          'step 3 00:07:00 00:01:00', 'checkpoint: the recovery point and the new lease');
SELECT is((SELECT expires_after FROM stored WHERE path = 'd' AND name = 'checkpoint'),
          interval '7 min', 'checkpoint: the key lives at least as long as the new lease');
SELECT is((SELECT format('%s %s %s %s', attempts, fingerprint, ttl, expires_after)
             FROM stored WHERE path = 'd' AND name = 'restart'),
          '1 \x06 03:00:00 03:00:00', 'an expired key claimed again starts over');
SELECT is((SELECT format('%s %s %s %s', status, response, response_code, expires_after)
             FROM stored WHERE path = 'd' AND name = 'twophase'),
          'completed [1, 2] 200 04:00:00', 'two-phase: completed, expiring ttl after the completion');

SELECT * FROM finish();
