-- One claim_key per round trip (the batch size does not apply: :n is ignored).
SELECT status, token FROM claim_key(gen_uuid_v7()::text, bench_fp());
