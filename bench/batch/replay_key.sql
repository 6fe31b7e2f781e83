-- One claim_key of a completed key per round trip: a replay.
\set k random(1, :nkeys)
SELECT status, response, response_code FROM claim_key('c' || :k, bench_fp());
