-- The hand-written pair with argument checks (checked.sql), claim + complete of a new key in one statement.
SELECT c FROM (SELECT gen_random_uuid()::text AS k) s,
  LATERAL pl_claim_checked(s.k, bench_fp()) cl,
  LATERAL pl_complete_checked(s.k, cl.token, '{"status": "ok", "payment_id": 12345, "amount": 100}', 200) c;
