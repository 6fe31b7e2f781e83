-- The executor path (issue #16). Any trigger on idempotency.idempotency_keys makes the
-- direct heap path step aside (src/key_heap.cpp, ExecutorReason::kTrigger): every write of
-- a claim then goes through the kept SPI plans, as on Citus and on every table with a
-- trigger, rule, CHECK, extra column or index. This trigger changes nothing; it counts its
-- calls, so that executor.check.sql can tell that the path was taken.
-- (No closing brace anywhere in this file: test/run.sh puts it into isolation specs,
-- whose SQL blocks end at the first one.)
CREATE SEQUENCE IF NOT EXISTS public.idem_executor_path_writes;
ALTER SEQUENCE public.idem_executor_path_writes RESTART;
CREATE OR REPLACE FUNCTION public.idem_executor_path() RETURNS trigger LANGUAGE plpgsql AS
  $$BEGIN PERFORM pg_catalog.nextval('public.idem_executor_path_writes'); RETURN NEW; END$$;
CREATE OR REPLACE TRIGGER idem_executor_path
  BEFORE INSERT OR UPDATE ON idempotency.idempotency_keys
  FOR EACH ROW EXECUTE FUNCTION public.idem_executor_path();
