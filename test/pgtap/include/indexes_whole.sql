-- Included (\ir) by the pgTAP files that check the key table's indexes after writes.
-- Every B-Tree of idempotency_keys holds exactly the heap's live rows (amcheck verifies each
-- heap tuple against the index, so a missing entry fails it). Needs CREATE EXTENSION amcheck.
-- A BRIN (the expiry index on PostgreSQL 16 and later) has no amcheck before 18: each live
-- row must be found by a scan of it for its own value (a summary that missed a write, say a
-- completion's new expires_at, leaves the row out of its range: brin_finds_every_row). The
-- index's key may be an expression (expiry_bucket(expires_at)): it is read as the index has it.
CREATE FUNCTION brin_finds_every_row(i regclass) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  col text := pg_get_indexdef(i, 1, true);
  r record;
  found boolean;
  seqscan text := current_setting('enable_seqscan');
BEGIN
  PERFORM set_config('enable_seqscan', 'off', true);
  FOR r IN EXECUTE format('SELECT ctid, %s AS v FROM idempotency_keys', col) LOOP
    EXECUTE format('SELECT coalesce(bool_or(ctid = $1), false) FROM idempotency_keys WHERE %s = $2', col)
      INTO found USING r.ctid, r.v;
    IF NOT found THEN
      RAISE WARNING 'index % misses the row at % (% = %)', i, r.ctid, col, r.v;
      PERFORM set_config('enable_seqscan', seqscan, true);
      RETURN false;
    END IF;
  END LOOP;
  PERFORM set_config('enable_seqscan', seqscan, true);
  RETURN true;
END
$$;
CREATE FUNCTION indexes_whole() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
  i regclass;
  am name;
BEGIN
  FOR i, am IN SELECT x.indexrelid::regclass, a.amname FROM pg_index x
                 JOIN pg_class c ON c.oid = x.indexrelid JOIN pg_am a ON a.oid = c.relam
                WHERE x.indrelid = 'idempotency_keys'::regclass LOOP
    IF am = 'brin' THEN
      IF NOT brin_finds_every_row(i) THEN RETURN false; END IF;
    ELSE
      PERFORM bt_index_check(i, true);
    END IF;
  END LOOP;
  RETURN true;
END
$$;
