-- The hand-written claim that makes the same checks and keeps the same promises (promised.sql) of a completed key.
\set n random(1, :nkeys)
SELECT status, response, response_code FROM plp_claim('c' || :n, bench_fp());
