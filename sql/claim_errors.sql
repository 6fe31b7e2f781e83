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
-- the limit is a setting
SET idempotency.max_key_length = 8;
SELECT pg_temp.try($$SELECT claim_key('123456789')$$);
RESET idempotency.max_key_length;

-- complete_key / release_key / checkpoint_key
SELECT pg_temp.try($$SELECT complete_key('held-key', NULL, '{}')$$);
SELECT pg_temp.try($$SELECT complete_key('no-such-key', gen_uuid_v7(), '{}')$$);
SELECT pg_temp.try(format($$SELECT complete_key('held-key', %L, '{}', scope => 'other')$$, :'held'));
SELECT pg_temp.try($$SELECT complete_key('held-key', gen_uuid_v7(), '{}')$$);
SELECT pg_temp.try($$SELECT release_key('held-key', gen_uuid_v7())$$);
SELECT pg_temp.try($$SELECT checkpoint_key('held-key', gen_uuid_v7(), 'x')$$);
SELECT pg_temp.try(format($$SELECT checkpoint_key('held-key', %L, 'x', lease => '-1 s')$$, :'held'));
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

-- another role: 42501, revealing neither response nor fingerprint
CREATE ROLE regress_idem_other;
GRANT USAGE ON SCHEMA public TO regress_idem_other;
SET ROLE regress_idem_other;
SELECT pg_temp.try($$SELECT claim_key('held-key')$$);
SELECT pg_temp.try(format($$SELECT complete_key('held-key', %L, '{}')$$, :'held'));
SELECT pg_temp.try($$SELECT count(*) FROM idempotency_keys$$);
SELECT pg_temp.try($$DELETE FROM idempotency_keys$$);
RESET ROLE;
DROP OWNED BY regress_idem_other;
DROP ROLE regress_idem_other;

-- gen_uuid_v7 out of range
SELECT pg_temp.try($$SELECT gen_uuid_v7('1969-12-31 23:59:59+00')$$);
SELECT pg_temp.try($$SELECT gen_uuid_v7('infinity')$$);
SELECT pg_temp.try($$SELECT gen_uuid_v7('10890-01-01+00')$$);
