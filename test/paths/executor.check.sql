-- After a test on the executor path, as a superuser: fails unless a claim in a session of
-- the test's settings took the executor path, then undoes executor.setup.sql. The
-- observable: only the executor path takes the per-key lock of src/key_lock.cpp for a new
-- key (the direct path lets the primary key arbitrate and keeps no lock-manager entry per
-- claim), an advisory lock whose last tag field (objsubid in pg_locks) is in the key-lock
-- space 0x1d00 .. 0x1dff (7424 .. 7679). The probe's claim is rolled back.
DO $$
DECLARE
  held bigint;
BEGIN
  BEGIN
    PERFORM idempotency.claim_key('executor path check ' || pg_backend_pid());
    SELECT count(*) INTO held FROM pg_locks
     WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND objsubid BETWEEN 7424 AND 7679;
    RAISE SQLSTATE 'PX001';
  EXCEPTION WHEN SQLSTATE 'PX001' THEN NULL;
  END;
  IF held IS DISTINCT FROM 1 THEN
    RAISE EXCEPTION 'executor path not taken: a new key''s claim held % key locks, not 1', held;
  END IF;
END$$;
DO $$BEGIN
  EXECUTE format('ALTER DATABASE %I RESET idempotency.executor_path', current_database());
END$$;
RESET idempotency.executor_path;
