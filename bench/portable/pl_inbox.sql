-- The hand-written pair, pl_claim + pl_complete of a new key in one statement.
SELECT c FROM (SELECT gen_random_uuid()::text AS k) s,
  LATERAL pl_claim(s.k, bench_fp()) cl,
  LATERAL pl_complete(s.k, cl.token, '{"status": "ok", "payment_id": 12345, "amount": 100}', 200) c;
