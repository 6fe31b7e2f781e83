-- One backend's memory over many calls (bench/run.sh memory).
-- psql variables: iterations (10 calls each), warmup (iterations before the first snapshot),
-- nkeys (preloaded keys). Prints: label, memory contexts bytes, RssAnon bytes, seconds.

CREATE OR REPLACE PROCEDURE bench_memory_loop(first bigint, last bigint, nkeys int)
LANGUAGE plpgsql AS $$
DECLARE
  k text;
  t uuid;
  other bytea := request_fingerprint('other'::text);
BEGIN
  FOR i IN first .. last LOOP
    k := 'mem' || i;
    SELECT token INTO t FROM claim_key(k, bench_fp());                       -- claimed
    PERFORM complete_key(k, t, '{"status": "ok"}', 200);                     -- completed
    FOR j IN 0 .. 2 LOOP
      PERFORM claim_key(k, bench_fp());                                       -- replay
      PERFORM claim_key('p' || ((i + j) % nkeys + 1), bench_fp());            -- in_progress
    END LOOP;
    PERFORM claim_key('c' || (i % nkeys + 1), other);                         -- mismatch
    PERFORM claim_key('c' || ((i + 1) % nkeys + 1), other);                   -- mismatch
    -- Each claim holds its key lock until the transaction ends: commit often enough to
    -- stay far below the shared lock table's size.
    IF i % 500 = 0 THEN
      COMMIT;
    END IF;
  END LOOP;
END
$$;

CREATE TEMP TABLE bench_memory_snapshot (label text, contexts bigint, rss_anon bigint, at timestamptz);

CREATE OR REPLACE PROCEDURE bench_memory_snapshot(label text)
LANGUAGE sql AS $$
  INSERT INTO bench_memory_snapshot
  SELECT label, (SELECT sum(total_bytes) FROM pg_backend_memory_contexts),
         (regexp_match(pg_read_file('/proc/self/status'), 'RssAnon:\s+(\d+) kB'))[1]::bigint * 1024,
         clock_timestamp();
$$;

CALL bench_memory_loop(1, :warmup, :nkeys);
CALL bench_memory_snapshot('after warm-up');
CALL bench_memory_loop(:warmup + 1, :warmup + :iterations / 2, :nkeys);
CALL bench_memory_snapshot('half-way');
CALL bench_memory_loop(:warmup + :iterations / 2 + 1, :warmup + :iterations, :nkeys);
CALL bench_memory_snapshot('at the end');

SELECT label, contexts, rss_anon,
       extract(epoch FROM at - first_value(at) OVER (ORDER BY at))
  FROM bench_memory_snapshot ORDER BY at;
