-- After a test on the executor path: fails unless the trigger of executor.setup.sql fired
-- (a write went through the executor), then removes what the setup made.
DO $$BEGIN
  IF NOT (SELECT is_called FROM public.idem_executor_path_writes) THEN
    RAISE EXCEPTION 'executor path not taken: no write reached the trigger on idempotency_keys';
  END IF;
END$$;
DROP TRIGGER idem_executor_path ON idempotency.idempotency_keys;
DROP FUNCTION public.idem_executor_path();
DROP SEQUENCE public.idem_executor_path_writes;
