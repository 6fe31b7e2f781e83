-- claim_key + complete_key of a new key in one statement (one transaction).
SELECT c.status FROM (SELECT gen_random_uuid()::text AS k) s,
  LATERAL claim_key(s.k, bench_fp()) cl,
  LATERAL complete_key(s.k, cl.token, '{"status": "ok", "payment_id": 12345, "amount": 100}', 200) c;
