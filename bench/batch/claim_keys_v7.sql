-- claim_keys of :n new keys from gen_uuid_v7(), one call.
SELECT count(*) FROM claim_keys(ARRAY(SELECT gen_uuid_v7()::text FROM generate_series(1, :n::int)),
                                ARRAY(SELECT bench_fp() FROM generate_series(1, :n::int)));
