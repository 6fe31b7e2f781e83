-- The hand-written pair that makes the same checks and keeps the same promises (promised.sql), claim + complete of a new key in one statement.
SELECT c FROM (SELECT gen_random_uuid()::text AS k) s,
  LATERAL plp_claim(s.k, bench_fp()) cl,
  LATERAL plp_complete(s.k, cl.token, '{"status": "ok", "payment_id": 12345, "amount": 100}', 200) c;
