-- The executor path (issue #16): the superuser's switch idempotency.executor_path sends every
-- claim of a session, its reads and its writes, through the kept SPI plans, as on Citus and
-- on every table the direct path leaves to the executor (an extra column or index, a typmod,
-- a NOT NULL). A trigger on idempotency_keys did this before 1.2, which now refuses any code
-- on the table (SECURITY.md). Run before a test, as a superuser:
--   - sessions that connect to this database from now on have the switch on (pgTAP);
--   - the session running this file has it on (the control session of an isolation spec);
--   - every session of an isolation spec, already connected when this runs, sets it at its
--     start: test/run.sh puts executor.session.sql into each session's setup.
-- executor.check.sql shows afterwards that the path was taken.
-- (No closing brace anywhere in this file: test/run.sh puts it into isolation specs,
-- whose SQL blocks end at the first one.)
DO $$BEGIN
  EXECUTE format('ALTER DATABASE %I SET idempotency.executor_path = on', current_database());
END$$;
SET idempotency.executor_path = on;
