-- The hand-written PL/pgSQL claim (bench/sql/setup.sql) of a new key.
SELECT status, token FROM pl_claim(gen_random_uuid()::text, bench_fp());
