-- claim_key of a completed key: replay.
\set n random(1, :nkeys)
SELECT status, response, response_code FROM claim_key('c' || :n, bench_fp());
