-- claim_key of a new random text key (a client-made UUIDv4 string).
SELECT status, token FROM claim_key(gen_random_uuid()::text, bench_fp());
