-- Inbox pattern as an application sends it: BEGIN; claim; complete; COMMIT (4 round trips).
BEGIN;
SELECT s.k, cl.token FROM (SELECT gen_uuid_v7()::text AS k) s, LATERAL claim_key(s.k, bench_fp()) cl \gset
SELECT status FROM complete_key(:k, :token, '{"status": "ok", "payment_id": 12345, "amount": 100}', 200);
COMMIT;
