-- The hand-written claim that makes the same checks and keeps the same promises (promised.sql) of a new key.
SELECT status, token FROM plp_claim(gen_random_uuid()::text, bench_fp());
