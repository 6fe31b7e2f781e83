-- Included (\ir) by the pgTAP files that check the key table's indexes after writes.
-- Every B-Tree of idempotency_keys holds exactly the heap's live rows (amcheck verifies each
-- heap tuple against the index, so a missing entry fails it). Needs CREATE EXTENSION amcheck.
CREATE FUNCTION indexes_whole() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  i regclass;
BEGIN
  FOR i IN SELECT indexrelid::regclass FROM pg_index WHERE indrelid = 'idempotency_keys'::regclass LOOP
    PERFORM bt_index_check(i, true);
  END LOOP;
  RETURN true;
END
$$;
