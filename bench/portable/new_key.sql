-- claim_key of a new key (either edition: the database decides which one answers).
SELECT status, token FROM claim_key(gen_random_uuid()::text, bench_fp());
