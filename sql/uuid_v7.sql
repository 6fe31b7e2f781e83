-- gen_uuid_v7() / gen_uuid_v7(timestamptz) / uuid_v7_time(uuid): RFC 9562 version 7
-- with PostgreSQL 18's layout (48-bit Unix ms, 12-bit sub-millisecond fraction).
SET TIME ZONE 'UTC';
SET datestyle = 'ISO, YMD';
CREATE FUNCTION pg_temp.try(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE statement;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- The time of a new value is within a millisecond of clock_timestamp(), read just before
-- and just after it (100 tries, each checked). First, before any bulk generation: calls
-- faster than one 1/4096 ms step each (a bulk SELECT) let the strictly increasing clock
-- of gen_uuid_v7() run ahead of the system clock for a while, as PostgreSQL 18's does.
DO $$
DECLARE
  before timestamptz;
  after timestamptz;
  at timestamptz;
  bad int := 0;
BEGIN
  FOR i IN 1..100 LOOP
    before := clock_timestamp();
    at := uuid_v7_time(gen_uuid_v7());
    after := clock_timestamp();
    IF at <= before - interval '1 ms' OR at >= after + interval '1 ms' THEN
      bad := bad + 1;
      RAISE NOTICE 'clock % .. % but uuid time %', before, after, at;
    END IF;
  END LOOP;
  RAISE NOTICE '% of 100 values more than 1 ms away from clock_timestamp()', bad;
END $$;

-- Version 7 (13th hex digit) and variant 10 (17th hex digit 8, 9, a or b), for generated
-- values and for values at a given time.
SELECT count(*) AS n,
       count(*) FILTER (WHERE substr(u::text, 15, 1) = '7') AS version_7,
       count(*) FILTER (WHERE substr(u::text, 20, 1) IN ('8', '9', 'a', 'b')) AS variant_10,
       count(DISTINCT u) AS distinct_values
  FROM (SELECT gen_uuid_v7() AS u FROM generate_series(1, 10000)) s;
SELECT count(*) AS n,
       count(*) FILTER (WHERE substr(u::text, 15, 1) = '7') AS version_7,
       count(*) FILTER (WHERE substr(u::text, 20, 1) IN ('8', '9', 'a', 'b')) AS variant_10,
       count(DISTINCT u) AS distinct_values
  FROM (SELECT gen_uuid_v7('2024-05-06 07:08:09.123456+00') AS u
          FROM generate_series(1, 1000)) s;

-- Each of the 62 random bits (bytes 8 to 15 but the variant; get_bit numbers the bits
-- of a byte from its least significant one, so the variant is bits 70 and 71) takes both
-- values over 2000 UUIDs: no stuck bit (a fair bit stays constant with p = 2^-1999).
SELECT count(*) AS random_bits,
       count(*) FILTER (WHERE ones = 0 OR ones = 2000) AS stuck_random_bits,
       count(*) FILTER (WHERE ones NOT BETWEEN 800 AND 1200) AS biased_random_bits
  FROM (SELECT i, sum(get_bit(uuid_send(u), i)) AS ones
          FROM (SELECT gen_uuid_v7() AS u FROM generate_series(1, 2000)) s,
               generate_series(64, 127) AS i
         WHERE i NOT IN (70, 71)
         GROUP BY i) b;

-- The example of RFC 9562 appendix A.6 decodes to its documented time.
SELECT uuid_v7_time('017F22E2-79B0-7CC3-98C4-DC0C0C07398F') AS rfc_9562_example;

-- Other versions and variants give NULL; so does NULL (strict).
SELECT uuid_v7_time(gen_random_uuid()) IS NULL AS v4,
       uuid_v7_time('C232AB00-9414-11EC-B3C8-9F6BDECED846') IS NULL AS rfc_v1_example,
       uuid_v7_time('1EC9414C-232A-6B00-B3C8-9F6BDECED846') IS NULL AS rfc_v6_example,
       uuid_v7_time('00000000-0000-0000-0000-000000000000') IS NULL AS nil,
       uuid_v7_time('FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF') IS NULL AS max,
       uuid_v7_time('017F22E2-79B0-7CC3-18C4-DC0C0C07398F') IS NULL AS v7_variant_0,
       uuid_v7_time('017F22E2-79B0-7CC3-C8C4-DC0C0C07398F') IS NULL AS v7_variant_110,
       uuid_v7_time(NULL) IS NULL AS null_input,
       gen_uuid_v7(NULL) IS NULL AS null_time;

-- gen_uuid_v7(ts): 48-bit ms, then the sub-millisecond fraction in 12 bits exactly as
-- PostgreSQL 18 computes it: 456 us = floor(0.456 * 4096) = 1867 = 0x74b.
SELECT substr(u::text, 1, 18) AS time_and_fraction, uuid_v7_time(u)
  FROM (SELECT gen_uuid_v7('2022-02-22 19:22:22.123456+00') AS u) s;
SELECT substr(gen_uuid_v7('1970-01-01 00:00:00+00')::text, 1, 18) AS unix_epoch,
       uuid_v7_time(gen_uuid_v7('1970-01-01 00:00:00+00')) AS unix_epoch_time;
SELECT substr(gen_uuid_v7('10889-08-02 05:31:50.655999+00')::text, 1, 18) AS last_ms,
       uuid_v7_time(gen_uuid_v7('10889-08-02 05:31:50.655999+00')) AS last_ms_time;

-- Round trip: uuid_v7_time(gen_uuid_v7(ts)) = ts truncated to the millisecond, for fixed
-- times and for 10000 random ones across the whole range.
SELECT ts, uuid_v7_time(gen_uuid_v7(ts)) = date_trunc('milliseconds', ts) AS round_trip
  FROM unnest(ARRAY['1970-01-01 00:00:00.000999+00', '2000-02-29 23:59:59.999999+00',
                    '2022-02-22 19:22:22.123456+00', '2038-01-19 03:14:08+00',
                    '2262-04-11 23:47:16.854775+00', '9999-12-31 23:59:59.999+00']::timestamptz[]) ts;
SELECT count(*) AS n,
       count(*) FILTER (WHERE uuid_v7_time(gen_uuid_v7(ts)) <> date_trunc('milliseconds', ts)) AS wrong
  FROM (SELECT to_timestamp(random() * 281474976710.655) AS ts
          FROM generate_series(1, 10000)) s;

-- Values made for later times sort later (the fraction orders values within a ms, to the microsecond).
SELECT bool_and(a < b) AS ordered_like_their_times
  FROM (SELECT gen_uuid_v7(ts) AS a, gen_uuid_v7(ts + interval '1 microsecond') AS b
          FROM (SELECT to_timestamp(random() * 4e9) AS ts FROM generate_series(1, 1000)) s) p;

-- 100000 values from this backend strictly increase (the pgTAP suite does 1M).
SELECT count(*) FILTER (WHERE u <= prev) AS not_increasing
  FROM (SELECT u, lag(u) OVER (ORDER BY i) AS prev
          FROM (SELECT i, gen_uuid_v7() AS u FROM generate_series(1, 100000) i) s) t;

-- Out of range: before 1970, after what 48 bits of ms hold, infinity. SQLSTATE 22008.
SELECT pg_temp.try($$SELECT gen_uuid_v7('1960-01-01 00:00:00+00')$$);
SELECT pg_temp.try($$SELECT gen_uuid_v7('1969-12-31 23:59:59.999999+00')$$);
SELECT pg_temp.try($$SELECT gen_uuid_v7('10889-08-02 05:31:50.656+00')$$);
SELECT pg_temp.try($$SELECT gen_uuid_v7('infinity')$$);
SELECT split_part(pg_temp.try($$SELECT gen_uuid_v7('-infinity')$$), ':', 1) AS minus_infinity;
\set VERBOSITY sqlstate
SELECT gen_uuid_v7('1960-01-01 00:00:00+00');
\set VERBOSITY default
-- The session is fine afterwards.
SELECT uuid_v7_time(gen_uuid_v7('2001-02-03 04:05:06.789+00')) AS still_working;

-- Volatile: each row gets its own value, also in one statement.
SELECT count(DISTINCT gen_uuid_v7()) AS distinct_in_one_statement FROM generate_series(1, 100);
