-- The PL/pgSQL claim of a new key.
SELECT status, token FROM pl_claim(gen_uuid_v7()::text, bench_fp());
