-- The C++ / PostgreSQL boundary: errors raised deep inside C++, and PostgreSQL errors
-- that pass through C++ frames, arrive as ordinary SQL errors with their SQLSTATE; the
-- session stays usable, nothing leaks from one failed call into the next, and the server
-- never restarts (same postmaster start time, same backend pid at the end).
SELECT pg_postmaster_start_time() AS postmaster_started, pg_backend_pid() AS backend_pid \gset
CREATE FUNCTION pg_temp.try(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE statement;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END $$;

-- 1. Errors raised in C++ (idem::Error thrown, caught at the entry point, re-raised with
-- ereport) reach the client as plain errors: only the SQLSTATE is printed here.
\set VERBOSITY sqlstate
SELECT gen_uuid_v7('1960-01-01 00:00:00+00');
SELECT gen_uuid_v7('infinity');
SELECT claim_key(NULL);
SELECT claim_key('');
SELECT claim_key(repeat('k', 10000));
SELECT claim_key('k', wait => '-1 s');
SELECT complete_key('no-such-key', gen_uuid_v7(), '{}');
\set VERBOSITY default
SELECT 'usable after errors raised in C++' AS session;

-- 2. PostgreSQL errors raised inside PostgreSQL code that C++ called (SPI), passing back
-- through C++ frames.
-- a) a read-only transaction: the INSERT of the claim fails with 25006
BEGIN READ ONLY;
SELECT pg_temp.try($$SELECT claim_key('read-only-key')$$);
ROLLBACK;
-- b) code attached to the key table: refused by the installation check (42501), raised in C++
-- after the catalog reads that PostgreSQL code did for it, before the trigger could ever run
CREATE FUNCTION boundary_boom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'boom from a trigger under claim_key' USING ERRCODE = 'UB001';
END $$;
CREATE TRIGGER boundary_boom BEFORE INSERT ON idempotency_keys
  FOR EACH ROW EXECUTE FUNCTION boundary_boom();
SELECT pg_temp.try($$SELECT claim_key('trigger-key')$$);
\set VERBOSITY sqlstate
SELECT claim_key('trigger-key');
\set VERBOSITY default
-- the same error a thousand times, caught each time inside one transaction: a skipped
-- destructor (a leaked lock, an SPI connection left open) would break a later call
DO $$
DECLARE
  caught int := 0;
BEGIN
  FOR i IN 1..1000 LOOP
    BEGIN
      PERFORM claim_key('trigger-key-' || i);
    EXCEPTION WHEN SQLSTATE '42501' THEN
      caught := caught + 1;
    END;
  END LOOP;
  RAISE NOTICE 'caught % of 1000', caught;
END $$;
DROP TRIGGER boundary_boom ON idempotency_keys;
DROP FUNCTION boundary_boom();
-- c) statement_timeout fires while claim_key runs (cancel arrives inside SPI): 57014
SET statement_timeout = '200ms';
\set VERBOSITY sqlstate
SELECT count(claim_key('timeout-key-' || i)) FROM generate_series(1, 100000000) i;
\set VERBOSITY default
RESET statement_timeout;

-- 3. Nothing was left behind by the failed calls, and the same keys work now.
SELECT count(*) AS keys_left_by_failed_calls FROM idempotency_keys;
BEGIN;
DO $$
DECLARE
  caught int := 0;
BEGIN
  -- errors from C++ and from PostgreSQL, alternately, in one transaction
  FOR i IN 1..500 LOOP
    BEGIN
      PERFORM gen_uuid_v7('1960-01-01 00:00:00+00');
    EXCEPTION WHEN datetime_field_overflow THEN
      caught := caught + 1;
    END;
    BEGIN
      PERFORM claim_key(repeat('k', 10000));
    EXCEPTION WHEN string_data_right_truncation THEN
      caught := caught + 1;
    END;
  END LOOP;
  RAISE NOTICE 'caught % of 1000', caught;
END $$;
SELECT status, attempts FROM claim_key('trigger-key');
SELECT status FROM claim_key('trigger-key-1');
SELECT status FROM claim_key('read-only-key');
COMMIT;
SELECT count(*) AS keys_now FROM idempotency_keys;
SELECT status FROM claim_key('trigger-key');

-- 4. The same backend, and the server never restarted.
SELECT pg_postmaster_start_time() = :'postmaster_started' AS same_postmaster,
       pg_backend_pid() = :backend_pid AS same_backend;

DELETE FROM idempotency_keys;
