-- A walkthrough of the idempotency extension in plain SQL. Run it with
--   psql -X -v ON_ERROR_STOP=1 -f examples/sql/walkthrough.sql
-- in a database where you may CREATE EXTENSION (as a superuser, or the database owner
-- once the extension is installed). Each run uses fresh keys (UUIDv7s, as a client would
-- make them), so it can be run again; what it prints is in walkthrough.out.
\set QUIET on
\pset footer off
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE IF NOT EXISTS walkthrough_orders (id bigserial PRIMARY KEY, sku text, qty int);
-- The extension lives in its own schema, idempotency. An application role needs USAGE on
-- it (GRANT USAGE ON SCHEMA idempotency TO app;) and calls idempotency.claim_key(...), or
-- puts the schema on its search_path, as this walkthrough does. Keys belong to the role
-- that claims them (current_user).
SET search_path = public, idempotency;

\echo
\echo '== 1. Inbox pattern: claim, business write, complete and COMMIT in one transaction'
-- The client makes one key per logical request and sends it again with every retry.
SELECT gen_uuid_v7() AS key \gset
BEGIN;
SELECT status, attempts, token
  FROM claim_key(:'key', request_fingerprint('{"sku": "book", "qty": 1}'::jsonb)) \gset
\echo claim_key -> :status (attempts :attempts): do the work
INSERT INTO walkthrough_orders (sku, qty) VALUES ('book', 1);
SELECT status FROM complete_key(:'key', :'token', '{"order": "created", "sku": "book"}', 201) \gset
\echo complete_key -> :status
COMMIT;

\echo
\echo '== 2. The retry of that request: replay of the stored outcome, no second order'
SELECT count(*) AS orders_before FROM walkthrough_orders \gset
-- Same payload with another key order and spacing: equal jsonb, equal fingerprint.
SELECT status, response, response_code
  FROM claim_key(:'key', request_fingerprint('{"qty":1,"sku":"book"}'::jsonb));
SELECT count(*) - :orders_before AS new_orders FROM walkthrough_orders;

\echo
\echo '== 3. The same key with another payload: mismatch, and no response is revealed'
SELECT status, response IS NULL AS no_response
  FROM claim_key(:'key', request_fingerprint('{"sku": "book", "qty": 2}'::jsonb));

\echo
\echo '== 4. A rolled-back transaction takes its claim with it: the retry claims afresh'
SELECT gen_uuid_v7() AS key \gset
BEGIN;
SELECT status FROM claim_key(:'key') \gset
\echo first try: claim_key -> :status, then the handler fails
ROLLBACK;
BEGIN;
SELECT status, attempts FROM claim_key(:'key') \gset
\echo retry: claim_key -> :status (attempts :attempts)
ROLLBACK;

\echo
\echo '== 5. Two-phase pattern (for external calls): claim and COMMIT, call out, complete later'
SELECT gen_uuid_v7() AS key \gset
SELECT status, token FROM claim_key(:'key', lease => '5 minutes') \gset
\echo phase 1: claim_key -> :status, committed: the lease now protects the call to the API
-- A duplicate arriving during the call is told to come back later (HTTP 409 + Retry-After).
SELECT status, retry_after > '0' AS retry_later, retry_after <= '5 minutes' AS within_lease
  FROM claim_key(:'key');
-- Long calls can record progress and renew the lease (a heartbeat).
SELECT checkpoint_key(:'key', :'token', 'payment-authorized') > now() AS lease_renewed;
-- The gateway answered 503: give the key up without an outcome ...
SELECT release_key(:'key', :'token') \gset
\echo release_key: the key is free again
-- ... and the next attempt takes over at once, resuming from the checkpoint.
SELECT status, attempts, recovery_point, token FROM claim_key(:'key') \gset
\echo retry: claim_key -> :status (attempts :attempts, recovery_point :recovery_point)
-- phase 2, after the API call succeeded:
SELECT status FROM complete_key(:'key', :'token', '{"charge": "ch_1"}', 200) \gset
\echo phase 2: complete_key -> :status
SELECT status, response, response_code FROM claim_key(:'key');

\echo
\echo '== 6. Fencing: after a lease expired and someone reclaimed, the old token is refused'
SELECT gen_uuid_v7() AS key \gset
SELECT token AS old_token FROM claim_key(:'key', lease => '10 milliseconds') \gset
SELECT pg_sleep(0.05) \gset
SELECT status, token FROM claim_key(:'key') \gset
\echo the lease ran out: claim_key -> :status
\set ON_ERROR_STOP off
SELECT complete_key(:'key', :'old_token', '{"late": true}');
\echo complete_key with the old token -> error SQLSTATE :LAST_ERROR_SQLSTATE
\set ON_ERROR_STOP on
SELECT status FROM complete_key(:'key', :'token', '{"ok": true}') \gset
\echo complete_key with the current token -> :status

\echo
\echo '== 7. Scopes keep namespaces apart (per tenant, per endpoint)'
SELECT gen_uuid_v7() AS key \gset
SELECT (claim_key(:'key', scope => 'tenant-a')).status AS tenant_a,
       (claim_key(:'key', scope => 'tenant-b')).status AS tenant_b;

\echo
\echo '== 8. UUIDv7 keys carry their creation time'
SELECT uuid_v7_time(gen_uuid_v7()) BETWEEN now() - interval '1 minute' AND clock_timestamp()
       AS time_roundtrip,
       gen_uuid_v7() < gen_uuid_v7() AS increasing;
