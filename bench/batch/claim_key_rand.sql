-- One claim_key of a random text key per round trip.
SELECT status, token FROM claim_key(gen_random_uuid()::text, bench_fp());
