-- One test per status of claim_key (SPEC §3.1) and for complete / release / checkpoint.
-- Tokens and times change every run: the output shows statuses and stable fields only.
SET client_min_messages = warning;

-- claimed: a new key
SELECT status, token IS NOT NULL AS has_token, attempts, response, retry_after,
       expires_at - created_at AS ttl
  FROM claim_key('order-1', request_fingerprint('{"amount": 100}'::jsonb), ttl => '1 hour');

-- a ttl is one span with a month of 30 days, whatever the date: '1 mon' is 30 days,
-- '1 mon -2 days 36 hours' 29.5 days (the lease, 5 min, is shorter: the expiry is the ttl's)
SELECT status, expires_at - created_at AS ttl FROM claim_key('month-ttl', ttl => '1 mon');
SELECT status, expires_at - created_at AS ttl FROM claim_key('month-ttl-2', ttl => '1 mon -2 days 36 hours');

-- in_progress: the key is held (committed claim, live lease)
SELECT status, token, retry_after > '0' AND retry_after <= '5 min' AS retry_after_ok
  FROM claim_key('order-1', request_fingerprint('{"amount": 100}'::jsonb));

-- mismatch: same key, another request; the stored fingerprint, no response
SELECT status, token, response,
       fingerprint = request_fingerprint('{"amount": 100}'::jsonb) AS stored_fingerprint
  FROM claim_key('order-1', request_fingerprint('{"amount": 999}'::jsonb));

-- complete with the holder's token, then replay with the stored response
SELECT lease_token AS order1_token FROM idempotency_keys WHERE key = 'order-1' \gset
SELECT status, response, response_code, attempts
  FROM complete_key('order-1', :'order1_token', '{"charge": "ch_1"}', 201);
SELECT status, token, response, response_code, attempts
  FROM claim_key('order-1', request_fingerprint('{ "amount" :100 }'::jsonb));
-- a NULL fingerprint on either side is not checked
SELECT status, response_code FROM claim_key('order-1');
-- the stored expiry moved to completion time + ttl
SELECT expires_at - updated_at AS ttl_after_completion FROM idempotency_keys WHERE key = 'order-1';

-- completing again with the same token and response is a no-op success
SELECT status, response FROM complete_key('order-1', :'order1_token', '{"charge": "ch_1"}', 201);

-- released -> reclaimed at once, attempts + 1, recovery point kept
SELECT token AS t1 FROM claim_key('job-7') \gset
SELECT checkpoint_key('job-7', :'t1', 'step-2') > now() AS lease_renewed;
SELECT release_key('job-7', :'t1');
SELECT status, attempts, recovery_point, token <> :'t1' AS new_token FROM claim_key('job-7');

-- lease expired -> reclaimed
SELECT token AS t2 FROM claim_key('job-8', lease => '1 microsecond') \gset
SELECT status, attempts, token <> :'t2' AS new_token FROM claim_key('job-8');

-- expired key -> treated as absent even though no cleanup ran: claimed afresh
SELECT token AS t3 FROM claim_key('job-9', ttl => '1 microsecond', lease => '1 microsecond') \gset
SELECT status, attempts FROM claim_key('job-9');

-- inbox pattern: claim, business write, complete, one transaction; a rollback removes both
CREATE TABLE ledger (id text PRIMARY KEY, amount int);
BEGIN;
SELECT token AS t4 FROM claim_key('pay-1') \gset
INSERT INTO ledger VALUES ('pay-1', 50);
SELECT status FROM complete_key('pay-1', :'t4', '{"ok": true}');
ROLLBACK;
SELECT count(*) AS keys_after_rollback FROM idempotency_keys WHERE key = 'pay-1';
SELECT count(*) AS ledger_after_rollback FROM ledger;
BEGIN;
SELECT status, token AS t5 FROM claim_key('pay-1') \gset
INSERT INTO ledger VALUES ('pay-1', 50);
SELECT status FROM complete_key('pay-1', :'t5', '{"ok": true}');
COMMIT;
SELECT status, response FROM claim_key('pay-1');
SELECT * FROM ledger;

-- a second claim of a key this very transaction holds is in_progress, not a second claim
BEGIN;
SELECT status FROM claim_key('pay-2');
SELECT status FROM claim_key('pay-2');
ROLLBACK;

-- scopes keep equal keys apart
SELECT status FROM claim_key('shared', scope => 'tenant-a');
SELECT status FROM claim_key('shared', scope => 'tenant-b');
SELECT scope, key, status FROM idempotency_keys WHERE key = 'shared' ORDER BY scope;

-- keys are bytes, compared in the C collation
SELECT status FROM claim_key('ÄÖ-ключ-🔑');
SELECT status FROM claim_key('ÄÖ-ключ-🔑');

DROP TABLE ledger;
