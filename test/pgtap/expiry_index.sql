-- pgTAP: the expiry index and the completion's write (issue 39). On PostgreSQL 16 and later
-- idempotency_keys_expires_at_idx is a BRIN, and a completion, which moves expires_at, is a
-- HOT update (no new entry in the primary key) that still gives the BRIN the new value, as
-- the executor does for a summarizing index: a scan of the BRIN finds the key at its new
-- expiry. On 15 it is the B-Tree, and the completion a plain update. Both paths: the direct
-- completion (in the claim's transaction) and a later one.
-- Edition: C++ only: the layout chosen by the install script and the direct heap path.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;
CREATE EXTENSION amcheck;
CREATE EXTENSION pageinspect;

SELECT plan(19);

\ir include/indexes_whole.sql

SELECT current_setting('server_version_num')::int >= 160000 AS summarizing \gset
SELECT is((SELECT a.amname::text FROM pg_class i JOIN pg_am a ON a.oid = i.relam
            WHERE i.oid = 'idempotency.idempotency_keys_expires_at_idx'::regclass),
          CASE WHEN :'summarizing'::boolean THEN 'brin' ELSE 'btree' END,
          'the expiry index is a BRIN on PostgreSQL 16 and later, a B-Tree on 15');

-- Rows found through the expiry index alone (no sequential scan) with expires_at >= `since`
-- (on 16+ the BRIN's key is expiry_bucket(expires_at): the statement names it, as the
-- cleanup's does).
CREATE FUNCTION found_by_expiry_index(since timestamptz) RETURNS int LANGUAGE plpgsql AS $$
DECLARE n int;
BEGIN
  PERFORM set_config('enable_seqscan', 'off', true);
  IF current_setting('server_version_num')::int >= 160000 THEN
    SELECT count(*) INTO n FROM idempotency.idempotency_keys
     WHERE idempotency.expiry_bucket(expires_at) >= idempotency.expiry_bucket(since)
       AND expires_at >= since;
  ELSE
    SELECT count(*) INTO n FROM idempotency.idempotency_keys WHERE expires_at >= since;
  END IF;
  PERFORM set_config('enable_seqscan', 'on', true);
  RETURN n;
END $$;
-- The BRIN's summary of the first block range made again from the rows now there, so that a
-- later write outside it must widen it (on 15: nothing to do).
CREATE FUNCTION summarize_again() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF current_setting('server_version_num')::int >= 160000 THEN
    PERFORM brin_desummarize_range('idempotency.idempotency_keys_expires_at_idx', 0);
    PERFORM brin_summarize_range('idempotency.idempotency_keys_expires_at_idx', 0);
  END IF;
END $$;

-- The two-phase pattern: the claim commits, the range is summarized, the completion moves
-- the key's expiry past the summary's end.
CREATE TEMP TABLE c1 AS SELECT * FROM idempotency.claim_key('two-phase', ttl => '1 hour');
SELECT summarize_again();
SELECT pg_sleep(0.01);
BEGIN;
CREATE TEMP TABLE done1 AS
  SELECT * FROM idempotency.complete_key('two-phase', (SELECT token FROM c1), '{"ok": 1}'::jsonb, 200);
SELECT is((SELECT n_tup_hot_upd || '/' || n_tup_upd FROM pg_stat_xact_user_tables
            WHERE relid = 'idempotency.idempotency_keys'::regclass),
          CASE WHEN :'summarizing'::boolean THEN '1/1' ELSE '0/1' END,
          'the completion is a HOT update on 16+ (not on 15, where a B-Tree covers expires_at)');
COMMIT;
SELECT ok((SELECT expires_at > (SELECT expires_at FROM c1) FROM done1), 'the completion moved the expiry on');
SELECT is(found_by_expiry_index((SELECT expires_at FROM done1)), 1,
          'a scan of the expiry index finds the completed key at its new expiry');
SELECT ok(indexes_whole(), 'every index holds every row after the completion');

-- The inbox pattern (claim and completion in one statement): the new row's entry, then the
-- completion's.
SELECT summarize_again();
SELECT pg_sleep(0.01);
CREATE TEMP TABLE done2 AS
  SELECT c.* FROM idempotency.claim_key('inbox', ttl => '2 hours') cl,
         LATERAL idempotency.complete_key('inbox', cl.token, '{"ok": 2}'::jsonb, 200) c;
SELECT is((SELECT status::text FROM done2), 'replay', 'claim + complete in one statement');
SELECT is(found_by_expiry_index((SELECT expires_at FROM done2)), 1,
          'a scan of the expiry index finds the inbox key at its expiry');
SELECT ok(indexes_whole(), 'every index holds every row after the inbox completion');

-- A completion whose minute differs from the claim's: a claim's row expires at the end of its
-- lease when that is later than its ttl (here an hour against a minute), its completion a
-- minute after it completes. The BRIN must get the new minute, outside the summary of the
-- claim's (an unchanged minute needs no entry: the summary holds it already).
SELECT summarize_again();
BEGIN;
CREATE TEMP TABLE c3 AS SELECT * FROM idempotency.claim_key('moved-minute', ttl => '1 minute', lease => '1 hour');
CREATE TEMP TABLE done3 AS
  SELECT * FROM idempotency.complete_key('moved-minute', (SELECT token FROM c3), '{"ok": 3}'::jsonb, 200);
COMMIT;
SELECT ok((SELECT expires_at < (SELECT expires_at FROM c3) - interval '50 minutes' FROM done3),
          'its expiry moved back to a minute after the completion');
-- (as the cleanup asks: expired by then, read through the index; a summary that missed the
-- new minute would leave its range out)
CREATE FUNCTION found_expired_by(at timestamptz, wanted text) RETURNS int LANGUAGE plpgsql AS $$
DECLARE n int;
BEGIN
  PERFORM set_config('enable_seqscan', 'off', true);
  IF current_setting('server_version_num')::int >= 160000 THEN
    SELECT count(*) FILTER (WHERE key = wanted) INTO n FROM idempotency.idempotency_keys
     WHERE idempotency.expiry_bucket(expires_at) <= at AND expires_at <= at;
  ELSE
    SELECT count(*) FILTER (WHERE key = wanted) INTO n FROM idempotency.idempotency_keys
     WHERE expires_at <= at;
  END IF;
  PERFORM set_config('enable_seqscan', 'on', true);
  RETURN n;
END $$;
SELECT is(found_expired_by((SELECT expires_at FROM done3), 'moved-minute'), 1,
          'a scan of the expiry index finds it at its new minute');

-- The BRIN's key is the expiry rounded down to its minute: what the direct path wrote for
-- the inbox key (its claim's row, then its completion, past the summary's end) is a whole
-- minute at both ends of every summary (on 15 there is no BRIN to read).
SELECT ok(CASE WHEN NOT :'summarizing'::boolean THEN true ELSE (
            SELECT bool_and(extract(epoch FROM split_part(btrim(value, '{}'), ' .. ', 1)::timestamptz)::numeric % 60 = 0
                        AND extract(epoch FROM split_part(btrim(value, '{}'), ' .. ', 2)::timestamptz)::numeric % 60 = 0)
                   AND count(*) > 0
              FROM brin_page_items(get_raw_page('idempotency.idempotency_keys_expires_at_idx', 2),
                                   'idempotency.idempotency_keys_expires_at_idx')
             WHERE value IS NOT NULL) END,
          'the BRIN holds whole minutes: the direct path wrote expiry_bucket(expires_at)');
SELECT is(idempotency.expiry_bucket('2026-12-05 10:21:37.25+00'), '2026-12-05 10:21:00+00'::timestamptz,
          'expiry_bucket rounds down to the minute');
SELECT is(idempotency.expiry_bucket('2026-12-05 10:21:00+00'), '2026-12-05 10:21:00+00'::timestamptz,
          'a whole minute is its own bucket');
SELECT is(idempotency.expiry_bucket('1999-12-31 23:59:30.5+00'), '1999-12-31 23:59:00+00'::timestamptz,
          'before 2000 (a negative time inside PostgreSQL) too, never later than the expiry');
SELECT is(ARRAY[idempotency.expiry_bucket('infinity'), idempotency.expiry_bucket('-infinity')],
          ARRAY['infinity', '-infinity']::timestamptz[], 'infinity is its own bucket');

-- The cleanup with the expiry index, whatever its kind: expired keys of mixed ttls, in
-- insertion order, deleted; the live ones kept.
INSERT INTO idempotency.idempotency_keys (key, owner, owner_oid, owner_system, ttl, lease, created_at,
                                          expires_at, updated_at, status, response)
SELECT 'mixed-' || g, current_user, (SELECT oid FROM pg_roles WHERE rolname = current_user),
       (SELECT system_identifier FROM pg_control_system()),
       CASE WHEN g % 10 = 0 THEN interval '30 days' ELSE interval '24 hours' END, '5 minutes',
       now() - interval '25 hours',
       CASE WHEN g % 10 = 0 THEN now() + interval '29 days' ELSE now() - interval '1 hour' + g * interval '1 ms' END,
       now(), 'completed', '{}'
  FROM generate_series(1, 3000) g;
VACUUM idempotency.idempotency_keys;
-- (the server's worker may take some of them first: what is left is what counts)
SELECT lives_ok($$SELECT idempotency.idempotency_cleanup(batch_size => 100)$$,
                'the cleanup runs over expired keys of mixed ttls, in batches of 100');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys WHERE key LIKE 'mixed-%'), 300,
          'and keeps the 300 with 30 days to go');
SELECT is((SELECT count(*)::int FROM idempotency.idempotency_keys WHERE expires_at <= now()), 0,
          'no expired key is left');
SELECT ok(indexes_whole(), 'every index holds every row after the cleanup');

SELECT * FROM finish();
