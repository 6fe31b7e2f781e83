-- The hand-written claim with argument checks (checked.sql) of a new key.
SELECT status, token FROM pl_claim_checked(gen_random_uuid()::text, bench_fp());
