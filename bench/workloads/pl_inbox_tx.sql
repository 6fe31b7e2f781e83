-- The PL/pgSQL pair as an application sends it: BEGIN; claim; complete; COMMIT.
BEGIN;
SELECT s.k, cl.token FROM (SELECT gen_uuid_v7()::text AS k) s, LATERAL pl_claim(s.k, bench_fp()) cl \gset
SELECT pl_complete(:k, :token, '{"status": "ok", "payment_id": 12345, "amount": 100}', 200);
COMMIT;
