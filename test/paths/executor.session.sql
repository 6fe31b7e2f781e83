-- At the start of every session of an isolation spec on the executor path (before the
-- spec's own session setup, as the superuser the tester connects as): see executor.setup.sql.
SET idempotency.executor_path = on;
