-- Every bad input: a clear message, a documented SQLSTATE, and nothing changed.
SET client_min_messages = warning;
CREATE FUNCTION pg_temp.try(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE statement;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

SELECT token AS held FROM claim_key('held-key') \gset
SELECT md5(string_agg(t::text, ',' ORDER BY key)) AS before FROM idempotency_keys t \gset

-- claim_key
SELECT pg_temp.try($$SELECT claim_key(NULL)$$);
SELECT pg_temp.try($$SELECT claim_key('')$$);
SELECT pg_temp.try($$SELECT claim_key(repeat('k', 256))$$);
SELECT pg_temp.try($$SELECT claim_key('k', scope => NULL)$$);
SELECT pg_temp.try($$SELECT claim_key('k', scope => repeat('s', 256))$$);
SELECT pg_temp.try($$SELECT claim_key('k', ttl => '0')$$);
SELECT pg_temp.try($$SELECT claim_key('k', ttl => '-1 hour')$$);
SELECT pg_temp.try($$SELECT claim_key('k', lease => '0')$$);
SELECT pg_temp.try($$SELECT claim_key('k', lease => '-5 min')$$);
SELECT pg_temp.try($$SELECT claim_key('k', wait => '-1 s')$$);
SELECT pg_temp.try($$SELECT claim_key('k', ttl => '1000000 years')$$);
-- ttl and lease are bounded (idempotency.max_ttl 30 days, idempotency.max_lease 1 day). An
-- interval is one span with a month of 30 days and a day of 24 hours, whatever the date:
-- '1 mon 1 day' is 31 days, '1 mon -30 days' is zero, '1 mon -31 days' is negative.
SELECT pg_temp.try($$SELECT claim_key('k', ttl => '30 days 1 second')$$);
SELECT pg_temp.try($$SELECT claim_key('k', ttl => '1 mon 1 day')$$);
SELECT pg_temp.try($$SELECT claim_key('k', ttl => '10000 years')$$);
SELECT pg_temp.try($$SELECT claim_key('k', ttl => '1 mon -30 days')$$);
SELECT pg_temp.try($$SELECT claim_key('k', lease => '1 day 1 second')$$);
SELECT pg_temp.try($$SELECT claim_key('k', lease => '1 mon')$$);
SELECT pg_temp.try($$SELECT claim_key('k', wait => '1 mon -31 days')$$);
SELECT pg_temp.try($$SELECT claim_key('k', wait => '-1 day 86399 seconds')$$);
-- a wait that ends past the last timestamp (in the days before the int64 limit, where the
-- sum still fits): 22008, as timestamptz arithmetic says, whatever the date today
SELECT pg_temp.try($$SELECT claim_key('k', wait => (timestamptz '294276-12-31 00:00:00+00' - now()) + interval '3 days')$$);
-- the defaults, which any role may set, are held to the same limits
SET idempotency.default_ttl = '31d';
SELECT pg_temp.try($$SELECT claim_key('k')$$);
RESET idempotency.default_ttl;
SET idempotency.default_lease = '2d';
SELECT pg_temp.try($$SELECT claim_key('k')$$);
RESET idempotency.default_lease;
-- and the limits are settings
SET idempotency.max_ttl = '1h';
SELECT pg_temp.try($$SELECT claim_key('k', ttl => '61 min')$$);
RESET idempotency.max_ttl;
SET idempotency.max_lease = '1min';
SELECT pg_temp.try($$SELECT claim_key('k', lease => '2 min')$$);
RESET idempotency.max_lease;
-- a fingerprint is at most idempotency.max_fingerprint_size (64) bytes
SELECT pg_temp.try($$SELECT claim_key('k', decode(repeat('ab', 65), 'hex'))$$);
SET idempotency.max_fingerprint_size = 16;
SELECT pg_temp.try($$SELECT claim_key('k', request_fingerprint('x'::text))$$);
RESET idempotency.max_fingerprint_size;
-- the limit is a setting
SET idempotency.max_key_length = 8;
SELECT pg_temp.try($$SELECT claim_key('123456789')$$);
RESET idempotency.max_key_length;
-- whose ceiling is 1024 bytes (the primary key entry must fit a B-Tree page)
SELECT pg_temp.try($$SET idempotency.max_key_length = 1025$$);
SELECT pg_temp.try($$SET idempotency.max_key_length = 1024$$);
RESET idempotency.max_key_length;

-- complete_key / release_key / checkpoint_key
SELECT pg_temp.try($$SELECT complete_key('held-key', NULL, '{}')$$);
SELECT pg_temp.try($$SELECT complete_key('no-such-key', gen_uuid_v7(), '{}')$$);
SELECT pg_temp.try(format($$SELECT complete_key('held-key', %L, '{}', scope => 'other')$$, :'held'));
SELECT pg_temp.try($$SELECT complete_key('held-key', gen_uuid_v7(), '{}')$$);
SELECT pg_temp.try($$SELECT release_key('held-key', gen_uuid_v7())$$);
SELECT pg_temp.try($$SELECT checkpoint_key('held-key', gen_uuid_v7(), 'x')$$);
SELECT pg_temp.try(format($$SELECT checkpoint_key('held-key', %L, 'x', lease => '-1 s')$$, :'held'));
SELECT pg_temp.try(format($$SELECT checkpoint_key('held-key', %L, 'x', lease => '1 day 1 second')$$, :'held'));
-- a recovery point is at most idempotency.max_recovery_point_size (1024) bytes
SELECT pg_temp.try(format($$SELECT checkpoint_key('held-key', %L, repeat('x', 1025))$$, :'held'));
SELECT pg_temp.try(format($$SELECT checkpoint_key('held-key', %L, repeat('é', 513))$$, :'held'));
SET idempotency.max_recovery_point_size = 4;
SELECT pg_temp.try(format($$SELECT checkpoint_key('held-key', %L, 'step-1')$$, :'held'));
RESET idempotency.max_recovery_point_size;
SET idempotency.max_response_size = 100;
SELECT pg_temp.try(format($$SELECT complete_key('held-key', %L, jsonb_build_object('blob', repeat('x', 200)))$$, :'held'));
RESET idempotency.max_response_size;

-- nothing changed
SELECT md5(string_agg(t::text, ',' ORDER BY key)) = :'before' AS unchanged FROM idempotency_keys t;

-- after completion: completing with another response, releasing, checkpointing are refused
SELECT status FROM complete_key('held-key', :'held', '{"done": 1}');
SELECT pg_temp.try(format($$SELECT complete_key('held-key', %L, '{"done": 2}')$$, :'held'));
SELECT pg_temp.try(format($$SELECT release_key('held-key', %L)$$, :'held'));
SELECT pg_temp.try(format($$SELECT checkpoint_key('held-key', %L, 'x')$$, :'held'));

-- a released claim cannot be completed
SELECT token AS rel FROM claim_key('released-key') \gset
SELECT release_key('released-key', :'rel');
SELECT pg_temp.try(format($$SELECT complete_key('released-key', %L, '{}')$$, :'rel'));

-- a fenced-out holder: its lease ended and the key was reclaimed
SELECT token AS old FROM claim_key('fenced-key', lease => '1 microsecond') \gset
SELECT status FROM claim_key('fenced-key');
SELECT pg_temp.try(format($$SELECT complete_key('fenced-key', %L, '{}')$$, :'old'));
SELECT pg_temp.try(format($$SELECT checkpoint_key('fenced-key', %L, 'x')$$, :'old'));
SELECT pg_temp.try(format($$SELECT release_key('fenced-key', %L)$$, :'old'));

-- another role. Without USAGE on the schema idempotency nothing is reachable (42501).
CREATE ROLE regress_idem_other;
SET ROLE regress_idem_other;
SELECT pg_temp.try($$SELECT idempotency.claim_key('held-key')$$);
RESET ROLE;
-- With it, the role has keys of its own. This role's key, even with its token, does not
-- exist for it (P0002, as for an absent key: complete, release, checkpoint); the same scope
-- and key is another key, claimed afresh whether this role's key is completed (held-key)
-- or held (fenced-key), revealing neither response nor fingerprint; then the stolen token
-- does not hold that other key (55000); the table stays out of reach (42501).
GRANT USAGE ON SCHEMA idempotency TO regress_idem_other;
SELECT md5(string_agg(t::text, ',' ORDER BY key)) AS mine
  FROM idempotency_keys t WHERE owner = current_user \gset
SELECT lease_token AS fenced FROM idempotency_keys WHERE key = 'fenced-key' \gset
SET ROLE regress_idem_other;
SELECT pg_temp.try(format($$SELECT complete_key('held-key', %L, '{"done": 1}')$$, :'held'));
SELECT pg_temp.try(format($$SELECT complete_key('fenced-key', %L, '{}')$$, :'fenced'));
SELECT pg_temp.try(format($$SELECT release_key('fenced-key', %L)$$, :'fenced'));
SELECT pg_temp.try(format($$SELECT checkpoint_key('fenced-key', %L, 'x')$$, :'fenced'));
SELECT status, attempts, response, response_code, fingerprint, retry_after
  FROM claim_key('held-key', request_fingerprint('other'::text));
SELECT status, attempts, response, fingerprint, retry_after FROM claim_key('fenced-key');
SELECT pg_temp.try(format($$SELECT complete_key('fenced-key', %L, '{}')$$, :'fenced'));
SELECT pg_temp.try(format($$SELECT release_key('fenced-key', %L)$$, :'fenced'));
SELECT pg_temp.try($$SELECT count(*) FROM idempotency_keys$$);
SELECT pg_temp.try($$DELETE FROM idempotency_keys$$);
RESET ROLE;
SELECT md5(string_agg(t::text, ',' ORDER BY key)) = :'mine' AS own_keys_unchanged
  FROM idempotency_keys t WHERE owner = current_user;
SELECT key, owner, status, attempts FROM idempotency_keys
 WHERE key IN ('held-key', 'fenced-key') ORDER BY key, owner::text;
SELECT status, response FROM claim_key('held-key');
DELETE FROM idempotency_keys WHERE owner = 'regress_idem_other';
REVOKE USAGE ON SCHEMA idempotency FROM regress_idem_other;
DROP ROLE regress_idem_other;

-- gen_uuid_v7 out of range
SELECT pg_temp.try($$SELECT gen_uuid_v7('1969-12-31 23:59:59+00')$$);
SELECT pg_temp.try($$SELECT gen_uuid_v7('infinity')$$);
SELECT pg_temp.try($$SELECT gen_uuid_v7('10890-01-01+00')$$);
