-- gen_uuid_v7() beside PostgreSQL 18's native uuidv7(): the same layout, so values of both
-- sort together by time, and uuid_v7_time() agrees with uuid_extract_timestamp(). On servers
-- before 18 (no native function) the assertions are skipped.
-- Run by test/run.sh with pg_prove in a fresh database that has pgtap and idempotency.
BEGIN;
SET search_path = public, idempotency;
SELECT plan(6);
SELECT current_setting('server_version_num')::int >= 180000 AS native \gset
\if :native
-- Interleaved: ours, native, ours, ... each generated after the one before.
CREATE TEMP TABLE mixed (n int, u uuid, native boolean);
DO $$
BEGIN
  FOR i IN 1 .. 2000 LOOP
    INSERT INTO mixed VALUES (i, CASE WHEN i % 2 = 0 THEN uuidv7() ELSE gen_uuid_v7() END, i % 2 = 0);
    IF i % 200 = 0 THEN PERFORM pg_sleep(0.002); END IF;
  END LOOP;
END $$;
SELECT ok((SELECT bool_and(uuid_extract_version(u) = 7) FROM mixed), 'both are version 7');
SELECT is((SELECT count(*) FROM mixed WHERE uuid_v7_time(u) IS DISTINCT FROM uuid_extract_timestamp(u)),
          0::bigint, 'uuid_v7_time agrees with uuid_extract_timestamp on both kinds');
-- Across milliseconds the two kinds sort by time: a value of one kind generated in a later
-- millisecond than a value of the other sorts after it.
SELECT is((SELECT count(*) FROM mixed a JOIN mixed b ON a.native <> b.native
            WHERE uuid_v7_time(a.u) < uuid_v7_time(b.u) AND a.u > b.u), 0::bigint,
          'values of different milliseconds sort by time, whichever function made them');
SELECT is((SELECT count(*) FROM mixed a JOIN mixed b ON a.n < b.n
            WHERE uuid_v7_time(a.u) > uuid_v7_time(b.u)), 0::bigint,
          'the times never go back between the two functions');
SELECT is(uuid_v7_time(uuidv7('-1 hour'::interval)) < now() - interval '59 minutes', true,
          'uuid_v7_time reads a native value made for another time');
SELECT is(uuid_extract_timestamp(gen_uuid_v7('2024-02-29 12:34:56.789+00')),
          '2024-02-29 12:34:56.789+00'::timestamptz, 'uuid_extract_timestamp reads ours exactly');
\else
SELECT skip('PostgreSQL ' || current_setting('server_version') || ' has no native uuidv7()', 6);
\endif
SELECT * FROM finish();
ROLLBACK;
