-- The PL/pgSQL claim of a completed key: replay (insert conflicts, then SELECT ... FOR UPDATE).
\set n random(1, :nkeys)
SELECT status, response, response_code FROM pl_claim('c' || :n, bench_fp());
