-- claim_keys of :n new random text keys (client-made UUIDv4 strings), one call.
SELECT count(*) FROM claim_keys(ARRAY(SELECT gen_random_uuid()::text FROM generate_series(1, :n::int)),
                                ARRAY(SELECT bench_fp() FROM generate_series(1, :n::int)));
