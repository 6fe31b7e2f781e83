-- The double-charge story, told with the real API. Run by demo/run.sh (`make demo`) with
-- psql against a throw-away server; every delivery below really happens, in order.
\set ON_ERROR_STOP 1
-- Section 6 opens a second session with \! psql: it connects to this session's server and
-- database, whatever the environment says (psql -d demo works without PGDATABASE).
\setenv PGDATABASE :DBNAME
\setenv PGHOST :HOST
\setenv PGPORT :PORT
\setenv PGUSER :USER
\pset border 2
\pset null '-'
\pset footer off
\pset format wrapped
\pset columns 110
SET client_min_messages = warning;
-- The extension lives in its own schema, idempotency (demo/run.sh created it). An
-- application role needs one grant, GRANT USAGE ON SCHEMA idempotency TO app. Every call
-- names the schema and gives each literal its type (README.md, "Calling the functions").

\echo 'The consumer in demo/demo.sql calls, inside its own transaction:'
\echo '  idempotency.claim_key(message_id, idempotency.request_fingerprint(body), scope => ''payments'')'
\echo '  -> claimed: charge, idempotency.complete_key(message_id, token, response, 201);'
\echo '     replay: return the stored response; mismatch: 422; in_progress: 409 + retry_after'
\echo
\echo '=== 1. Keys: idempotency.gen_uuid_v7() makes time-ordered, B-Tree-friendly message ids ==='
SELECT idempotency.gen_uuid_v7() AS id, idempotency.uuid_v7_time(idempotency.gen_uuid_v7()) AS carries_time
  FROM generate_series(1, 3);

-- The business data: an account and its payments. The idempotency keys live in the same
-- database, so a key and the charge it guards commit or roll back together.
CREATE TABLE accounts (id text PRIMARY KEY, balance numeric(12, 2) NOT NULL);
CREATE TABLE payments (
  id serial PRIMARY KEY,
  message_id text NOT NULL,
  account text NOT NULL REFERENCES accounts,
  amount numeric(12, 2) NOT NULL,
  via text NOT NULL);
INSERT INTO accounts VALUES ('alice', 100.00);

-- The broker's messages (at-least-once: each may arrive several times) and what each
-- delivery got, for the table at the end.
CREATE TABLE inbox (label text PRIMARY KEY, message jsonb NOT NULL);
CREATE TABLE deliveries (
  n serial, label text, session text, what_happened text,
  status text, response_code int, response jsonb, charged boolean);

INSERT INTO inbox
SELECT label, jsonb_build_object('message_id', id::text, 'body', body)
  FROM (VALUES
    ('M1', idempotency.gen_uuid_v7(), '{"account": "alice", "amount": 25.00}'::jsonb),
    ('M2', idempotency.gen_uuid_v7(), '{"account": "alice", "amount": 40.00}'),
    ('M3', idempotency.gen_uuid_v7(), '{"account": "alice", "amount": 15.00, "via": "card gateway"}')
  ) AS m(label, id, body);

-- The consumer, inbox pattern: claim the message id, charge, store the outcome, all in
-- the caller's transaction. Duplicates are answered from the stored outcome.
CREATE FUNCTION consume(msg jsonb, OUT status text, OUT response_code int,
                        OUT response jsonb, OUT charged boolean)
LANGUAGE plpgsql AS $$
DECLARE
  c idempotency.claim_result;
  payment int;
BEGIN
  c := idempotency.claim_key(msg->>'message_id', idempotency.request_fingerprint(msg->'body'),
                             scope => 'payments'::text);
  status := c.status;
  charged := false;
  CASE c.status
    WHEN 'claimed', 'reclaimed' THEN
      UPDATE accounts SET balance = balance - (msg->'body'->>'amount')::numeric
       WHERE id = msg->'body'->>'account';
      INSERT INTO payments (message_id, account, amount, via)
      VALUES (msg->>'message_id', msg->'body'->>'account', (msg->'body'->>'amount')::numeric, 'consumer')
      RETURNING id INTO payment;
      response := jsonb_build_object('payment', payment, 'charged', msg->'body'->'amount');
      response_code := 201;
      PERFORM idempotency.complete_key(msg->>'message_id', c.token, response, response_code,
                                       scope => 'payments'::text);
      charged := true;
    WHEN 'replay' THEN          -- already done: return the stored outcome, touch nothing
      response := c.response;
      response_code := c.response_code;
    WHEN 'mismatch' THEN        -- same key, different request: reject
      response := jsonb_build_object('error', 'key reused with a different payload');
      response_code := 422;
    WHEN 'in_progress' THEN     -- another consumer holds it right now: retry later
      response := jsonb_build_object('retry_after', c.retry_after);
      response_code := 409;
  END CASE;
END $$;

-- One delivery of an inbox message, logged (in its own transaction when autocommit).
CREATE FUNCTION deliver(label_ text, session_ text, what text)
RETURNS SETOF deliveries LANGUAGE sql AS $$
  INSERT INTO deliveries (label, session, what_happened, status, response_code, response, charged)
  SELECT label_, session_, what, d.status, d.response_code, d.response, d.charged
    FROM inbox, consume(inbox.message) d
   WHERE inbox.label = label_
  RETURNING *
$$;

\echo
\echo '=== 2. The messages (M3 is charged through an external card gateway) ==='
SELECT label, message->>'message_id' AS message_id, message->'body' AS body FROM inbox ORDER BY label;

\echo
\echo '=== 3. M1, delivery 1: the consumer claims and charges, then crashes before COMMIT ==='
BEGIN;
SELECT status AS d1_status, response_code AS d1_code, charged AS d1_charged
  FROM inbox, consume(message) WHERE label = 'M1' \gset
SELECT 'inside the open transaction' AS "delivery 1", :'d1_status' AS status,
       (SELECT balance FROM accounts) AS balance_seen_inside;
ROLLBACK;  -- the process died: the claim and the charge vanish together
INSERT INTO deliveries (label, session, what_happened, status, response_code, charged)
VALUES ('M1', 'A', 'consumer crashed before COMMIT (rolled back)', :'d1_status', NULL, false);
SELECT balance AS balance_after_crash,
       (SELECT count(*) FROM idempotency.idempotency_keys) AS keys_stored FROM accounts;

\echo
\echo '=== 4. M1, delivery 2 (broker redelivers) and delivery 3 (a duplicate) ==='
SELECT label, status, response_code, response, charged
  FROM deliver('M1', 'A', 'redelivered after the crash: does the work');
SELECT label, status, response_code, response, charged
  FROM deliver('M1', 'A', 'duplicate: the stored response, no charge');

\echo
\echo '=== 5. M1 again, but a buggy producer changed the amount under the same key ==='
INSERT INTO inbox
SELECT 'M1*', jsonb_set(message, '{body,amount}', '99.00') FROM inbox WHERE label = 'M1';
SELECT label, message->>'message_id' AS message_id, message->'body' AS body FROM inbox WHERE label = 'M1*';
SELECT label, status, response_code, response, charged
  FROM deliver('M1*', 'A', 'same key, different payload: rejected');

\echo
\echo '=== 6. M2 arrives twice at once: session A is still working when session B gets it ==='
BEGIN;
SELECT label, status, response_code, charged
  FROM deliver('M2', 'A', 'claimed, charged, completed; COMMIT comes later');
\echo '--- session B (a second connection, run now while A''s transaction is open):'
\! psql -X -q -v ON_ERROR_STOP=1 -c "\pset border 2" -c "\pset footer off" -c "SELECT label, status, response_code, response->>'retry_after' AS retry_after, charged FROM deliver('M2', 'B', 'while A is open: in progress, retry later')"
COMMIT;
\echo '--- session A committed; B retries:'
\! psql -X -q -v ON_ERROR_STOP=1 -c "\pset border 2" -c "\pset footer off" -c "SELECT label, status, response_code, response, charged FROM deliver('M2', 'B', 'retry after A committed: the stored response')"

\echo
\echo '=== 7. M3, two-phase: the card gateway is outside the database ==='
-- The claim commits on its own (with a short lease), the gateway is called, and the
-- outcome is stored in a later transaction.
SELECT token AS t1, status AS m3_status FROM inbox,
       idempotency.claim_key(message->>'message_id', idempotency.request_fingerprint(message->'body'),
                             scope => 'card-gateway'::text, lease => '300 ms'::interval)
 WHERE label = 'M3' \gset
SELECT idempotency.checkpoint_key(message->>'message_id', :'t1'::uuid, 'gateway: charge requested'::text,
                                  scope => 'card-gateway'::text, lease => '300 ms'::interval) IS NOT NULL AS checkpointed
  FROM inbox WHERE label = 'M3' \gset
INSERT INTO deliveries (label, session, what_happened, status, charged)
VALUES ('M3', 'A', 'claimed, asked the gateway, then the consumer died', :'m3_status', false);
\echo '(consumer A is gone; its 300 ms lease runs out)'
SELECT pg_sleep(0.4) AS slept \gset
SELECT token AS t2, status AS m3_status2, attempts, recovery_point FROM inbox,
       idempotency.claim_key(message->>'message_id', idempotency.request_fingerprint(message->'body'),
                             scope => 'card-gateway'::text, lease => '1 min'::interval)
 WHERE label = 'M3' \gset
SELECT :'m3_status2' AS "redelivery to B", :attempts AS attempts, :'recovery_point' AS resumes_from;
-- B asks the gateway about this idempotency key: the charge did go through once.
BEGIN;
UPDATE accounts SET balance = balance - 15.00 WHERE id = 'alice';
INSERT INTO payments (message_id, account, amount, via)
SELECT message->>'message_id', 'alice', 15.00, 'card gateway' FROM inbox WHERE label = 'M3';
SELECT status AS m3_done FROM inbox,
       idempotency.complete_key(message->>'message_id', :'t2'::uuid, '{"gateway": "captured"}'::jsonb, 201, scope => 'card-gateway'::text)
 WHERE label = 'M3' \gset
COMMIT;
INSERT INTO deliveries (label, session, what_happened, status, response_code, response, charged)
VALUES ('M3', 'B', 'lease expired: reclaimed, resumed, completed', :'m3_status2', 201, '{"gateway": "captured"}', true);
-- A comes back to life and tries to complete with its stale token: fenced off.
CREATE FUNCTION pg_temp.try(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE statement;
  RETURN 'accepted';
EXCEPTION WHEN OTHERS THEN
  RETURN 'rejected, SQLSTATE ' || SQLSTATE || ': ' || SQLERRM;
END $$;
SELECT pg_temp.try(format(
  $$SELECT idempotency.complete_key(%L::text, %L::uuid, '{"gateway": "captured"}'::jsonb, 201, scope => 'card-gateway'::text)$$,
  message->>'message_id', :'t1')) AS "late complete_key from A (stale token)"
  FROM inbox WHERE label = 'M3';
INSERT INTO deliveries (label, session, what_happened, status, charged)
VALUES ('M3', 'A', 'woke up late, stale token: fenced off', 'rejected', false);

\echo
\echo '=== 8. Every delivery and what it got ==='
SELECT n AS "#", label AS msg, session AS s, what_happened, status, response_code AS code,
       CASE WHEN charged THEN 'yes' ELSE 'no' END AS charged
  FROM deliveries ORDER BY n;

\echo
\echo '=== 9. The outcome: every message charged exactly once, however often it came ==='
SELECT label AS msg, (i.message->'body'->>'amount')::numeric AS amount,
       (SELECT count(*) FROM deliveries d
         WHERE d.label IN (i.label, i.label || '*') AND d.status <> 'rejected') AS deliveries,
       (SELECT count(*) FROM payments p WHERE p.message_id = i.message->>'message_id') AS times_charged
  FROM inbox i WHERE label IN ('M1', 'M2', 'M3') ORDER BY label;
SELECT a.balance AS final_balance, 100.00 - 25.00 - 40.00 - 15.00 AS expected_balance,
       a.balance = 100.00 - 25.00 - 40.00 - 15.00 AS charged_once
  FROM accounts a;
SELECT scope, status, attempts, response_code FROM idempotency.idempotency_keys ORDER BY created_at;
