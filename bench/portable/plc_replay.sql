-- The hand-written claim with argument checks (checked.sql) of a completed key.
\set n random(1, :nkeys)
SELECT status, response, response_code FROM pl_claim_checked('c' || :n, bench_fp());
