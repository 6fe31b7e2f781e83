-- claim_key of a key whose holder's lease is live: in_progress.
\set n random(1, :nkeys)
SELECT status, retry_after FROM claim_key('p' || :n, bench_fp());
