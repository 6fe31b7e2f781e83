-- claim_keys of :n completed keys: :n replays in one call.
\set s random(1, :nkeys - :n)
\set e :s + :n - 1
SELECT count(*) FROM claim_keys(ARRAY(SELECT 'c' || g FROM generate_series(:s::int, :e::int) g),
                                ARRAY(SELECT bench_fp() FROM generate_series(1, :n::int)));
