-- gen_uuid_v7(): strictly increasing within one backend, whatever the session settings,
-- in bulk, across statements and transactions, and interleaved with gen_uuid_v7(ts).
-- Run by test/run.sh with pg_prove in a fresh database that has pgtap and idempotency.
-- Edition: C++ only: a million values in bulk (the portable edition makes about 10,000 a second; its values are checked by portable_install.sql).
BEGIN;
SELECT plan(14);

-- 1M values from one backend: each one greater than the one before (lag over the
-- generation order).
CREATE TEMP TABLE million AS
  SELECT i, gen_uuid_v7() AS u FROM generate_series(1, 1000000) AS i;
SELECT is((SELECT count(*) FROM million), 1000000::bigint, '1M values generated');
SELECT is(
  (SELECT count(*) FROM (SELECT u, lag(u) OVER (ORDER BY i) AS prev FROM million) t
    WHERE u <= prev),
  0::bigint, '1M values from one backend are strictly increasing');
SELECT is((SELECT count(DISTINCT u) FROM million), 1000000::bigint, '1M values are distinct');
SELECT ok((SELECT bool_and(substr(u::text, 15, 1) = '7' AND substr(u::text, 20, 1) IN ('8', '9', 'a', 'b'))
             FROM million),
          'every one of them is version 7, variant 10');
-- Many values fall into one millisecond: the sub-millisecond bits keep them apart.
SELECT cmp_ok((SELECT max(c) FROM (SELECT count(*) AS c FROM million GROUP BY uuid_v7_time(u)) g),
              '>', 1::bigint, 'several values share a millisecond and still increase');
SELECT ok((SELECT max(uuid_v7_time(u)) - min(uuid_v7_time(u)) < interval '1 minute' FROM million),
          'the times of 1M values span less than a minute (no runaway counter)');

-- Values keep increasing across statements, whatever the session's time zone and
-- DateStyle (the clock is Unix time, never local time).
CREATE TEMP TABLE seq (n serial, u uuid);
CREATE FUNCTION pg_temp.gen(k int) RETURNS void LANGUAGE sql AS
  $$ INSERT INTO seq (u) SELECT gen_uuid_v7() FROM generate_series(1, k) $$;
SELECT pg_temp.gen(1000);
SET TIME ZONE 'Pacific/Kiritimati';   -- UTC+14
SELECT pg_temp.gen(1000);
SET TIME ZONE 'Etc/GMT+12';           -- UTC-12
SELECT pg_temp.gen(1000);
SET DateStyle = 'SQL, DMY';
SET TIME ZONE 'America/St_Johns';     -- UTC-3:30 (or -2:30)
SELECT pg_temp.gen(1000);
RESET TIME ZONE;
RESET DateStyle;
SELECT is((SELECT count(*) FROM (SELECT u, lag(u) OVER (ORDER BY n) AS prev FROM seq) t WHERE u <= prev),
          0::bigint, 'strictly increasing across SET TIME ZONE and DateStyle changes');

-- gen_uuid_v7(ts) for a time in the past or future does not disturb the sequence of
-- gen_uuid_v7(): values generated after it keep increasing from the last one.
TRUNCATE seq;
INSERT INTO seq (u) SELECT gen_uuid_v7() FROM generate_series(1, 100);
CREATE TEMP TABLE past_and_future AS
  SELECT gen_uuid_v7('2999-01-01 00:00:00+00') AS future, gen_uuid_v7('1999-01-01 00:00:00+00') AS past;
INSERT INTO seq (u) SELECT gen_uuid_v7() FROM generate_series(1, 100);
SELECT is((SELECT count(*) FROM (SELECT u, lag(u) OVER (ORDER BY n) AS prev FROM seq) t WHERE u <= prev),
          0::bigint, 'gen_uuid_v7(ts) in between does not break the increasing sequence');
SELECT ok((SELECT max(uuid_v7_time(u)) < clock_timestamp() + interval '1 minute' FROM seq),
          'gen_uuid_v7(future ts) does not drag the clock of gen_uuid_v7() forward');

-- Across subtransactions that roll back (the generator state is not transactional).
TRUNCATE seq;
INSERT INTO seq (u) VALUES (gen_uuid_v7());
SAVEPOINT s1;
INSERT INTO seq (u) SELECT gen_uuid_v7() FROM generate_series(1, 10);
ROLLBACK TO SAVEPOINT s1;
CREATE TEMP TABLE after_rollback AS SELECT gen_uuid_v7() AS u;
SELECT ok((SELECT u FROM after_rollback) > (SELECT u FROM seq ORDER BY u DESC LIMIT 1),
          'a value generated after a rolled-back subtransaction is greater than the one before');

-- In one statement with many rows, each call gets its own value (VOLATILE), in order.
SELECT is((SELECT count(DISTINCT u) FROM (SELECT gen_uuid_v7() AS u FROM generate_series(1, 10000)) s),
          10000::bigint, 'one value per row in one statement');

-- The function signatures and volatility are what the README promises.
SELECT function_returns('gen_uuid_v7', ARRAY[]::text[], 'uuid', 'gen_uuid_v7() returns uuid');
SELECT volatility_is('gen_uuid_v7', ARRAY[]::text[], 'volatile', 'gen_uuid_v7() is volatile');
SELECT volatility_is('uuid_v7_time', ARRAY['uuid'], 'immutable', 'uuid_v7_time(uuid) is immutable');

SELECT * FROM finish();
ROLLBACK;
