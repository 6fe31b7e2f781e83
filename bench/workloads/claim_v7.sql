-- claim_key of a new key from gen_uuid_v7().
SELECT status, token FROM claim_key(gen_uuid_v7()::text, bench_fp());
