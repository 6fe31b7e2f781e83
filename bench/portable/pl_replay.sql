-- The hand-written PL/pgSQL claim of a completed key.
\set n random(1, :nkeys)
SELECT status, response, response_code FROM pl_claim('c' || :n, bench_fp());
