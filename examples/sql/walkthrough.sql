-- A walkthrough of the idempotency extension in plain SQL. Run it as the application role,
--   psql -X -v ON_ERROR_STOP=1 -U app -d app -f examples/sql/walkthrough.sql
-- in a database where a superuser ran CREATE EXTENSION idempotency and GRANT USAGE ON SCHEMA
-- idempotency TO app, and where app may create a table (the owner of the database may). Each
-- run uses fresh keys (UUIDv7s, as a client would make them), so it can be run again; what it
-- prints is in walkthrough.out. Every call names the schema and gives each literal its type
-- (README.md, "Calling the functions"). Keys belong to the role that claims them.
\set QUIET on
\pset footer off
SET client_min_messages = warning;
CREATE TABLE IF NOT EXISTS walkthrough_orders (id bigserial PRIMARY KEY, sku text, qty int);

\echo
\echo '== 1. Inbox pattern: claim, business write, complete and COMMIT in one transaction'
-- The client makes one key per logical request and sends it again with every retry.
SELECT idempotency.gen_uuid_v7() AS key \gset
BEGIN;
SELECT status, attempts, token
  FROM idempotency.claim_key(:'key'::text, idempotency.request_fingerprint('{"sku": "book", "qty": 1}'::jsonb)) \gset
\echo claim_key -> :status (attempts :attempts): do the work
INSERT INTO walkthrough_orders (sku, qty) VALUES ('book', 1);
SELECT status FROM idempotency.complete_key(:'key'::text, :'token'::uuid, '{"order": "created", "sku": "book"}'::jsonb, 201) \gset
\echo complete_key -> :status
COMMIT;

\echo
\echo '== 2. The retry of that request: replay of the stored outcome, no second order'
SELECT count(*) AS orders_before FROM walkthrough_orders \gset
-- Same payload with another key order and spacing: equal jsonb, equal fingerprint.
SELECT status, response, response_code
  FROM idempotency.claim_key(:'key'::text, idempotency.request_fingerprint('{"qty":1,"sku":"book"}'::jsonb));
SELECT count(*) - :orders_before AS new_orders FROM walkthrough_orders;

\echo
\echo '== 3. The same key with another payload: mismatch, and no response is revealed'
SELECT status, response IS NULL AS no_response
  FROM idempotency.claim_key(:'key'::text, idempotency.request_fingerprint('{"sku": "book", "qty": 2}'::jsonb));

\echo
\echo '== 4. A rolled-back transaction takes its claim with it: the retry claims afresh'
SELECT idempotency.gen_uuid_v7() AS key \gset
BEGIN;
SELECT status FROM idempotency.claim_key(:'key'::text) \gset
\echo first try: claim_key -> :status, then the handler fails
ROLLBACK;
BEGIN;
SELECT status, attempts FROM idempotency.claim_key(:'key'::text) \gset
\echo retry: claim_key -> :status (attempts :attempts)
ROLLBACK;

\echo
\echo '== 5. Two-phase pattern (for external calls): claim and COMMIT, call out, complete later'
SELECT idempotency.gen_uuid_v7() AS key \gset
SELECT status, token FROM idempotency.claim_key(:'key'::text, lease => '5 minutes'::interval) \gset
\echo phase 1: claim_key -> :status, committed: the lease now protects the call to the API
-- A duplicate arriving during the call is told to come back later (HTTP 409 + Retry-After).
SELECT status, retry_after > '0' AS retry_later, retry_after <= '5 minutes' AS within_lease
  FROM idempotency.claim_key(:'key'::text);
-- Long calls can record progress and renew the lease (a heartbeat).
SELECT idempotency.checkpoint_key(:'key'::text, :'token'::uuid, 'payment-authorized'::text) > now() AS lease_renewed;
-- The gateway answered 503: give the key up without an outcome ...
SELECT idempotency.release_key(:'key'::text, :'token'::uuid) \gset
\echo release_key: the key is free again
-- ... and the next attempt takes over at once, resuming from the checkpoint.
SELECT status, attempts, recovery_point, token FROM idempotency.claim_key(:'key'::text) \gset
\echo retry: claim_key -> :status (attempts :attempts, recovery_point :recovery_point)
-- phase 2, after the API call succeeded:
SELECT status FROM idempotency.complete_key(:'key'::text, :'token'::uuid, '{"charge": "ch_1"}'::jsonb, 200) \gset
\echo phase 2: complete_key -> :status
SELECT status, response, response_code FROM idempotency.claim_key(:'key'::text);

\echo
\echo '== 6. Fencing: after a lease expired and someone reclaimed, the old token is refused'
SELECT idempotency.gen_uuid_v7() AS key \gset
SELECT token AS old_token FROM idempotency.claim_key(:'key'::text, lease => '10 milliseconds'::interval) \gset
SELECT pg_sleep(0.05) \gset
SELECT status, token FROM idempotency.claim_key(:'key'::text) \gset
\echo the lease ran out: claim_key -> :status
\set ON_ERROR_STOP off
SELECT idempotency.complete_key(:'key'::text, :'old_token'::uuid, '{"late": true}'::jsonb);
\echo complete_key with the old token -> error SQLSTATE :LAST_ERROR_SQLSTATE
\set ON_ERROR_STOP on
SELECT status FROM idempotency.complete_key(:'key'::text, :'token'::uuid, '{"ok": true}'::jsonb) \gset
\echo complete_key with the current token -> :status

\echo
\echo '== 7. Scopes keep namespaces apart (per tenant, per endpoint)'
SELECT idempotency.gen_uuid_v7() AS key \gset
SELECT (idempotency.claim_key(:'key'::text, scope => 'tenant-a'::text)).status AS tenant_a,
       (idempotency.claim_key(:'key'::text, scope => 'tenant-b'::text)).status AS tenant_b;

\echo
\echo '== 8. UUIDv7 keys carry their creation time'
SELECT idempotency.uuid_v7_time(idempotency.gen_uuid_v7()) BETWEEN now() - interval '1 minute' AND clock_timestamp()
       AS time_roundtrip,
       idempotency.gen_uuid_v7() < idempotency.gen_uuid_v7() AS increasing;
