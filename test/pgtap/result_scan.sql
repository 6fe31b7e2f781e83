-- pgTAP: claim_key and complete_key in FROM run by the extension's scan (src/result_scan.cpp)
-- answer what PostgreSQL's function scan answers, and the scan does the function scan's duties:
-- the EXECUTE privilege, the function statistics, strictness, one call per set of arguments
-- (again for each outer row of a LATERAL call, not again when a join rescans it unchanged), a
-- scrollable cursor, a plan that outlives the extension. Every case that the scan leaves to
-- the function scan (a whole-row reference, ORDINALITY, a function wrapped by SET) keeps it.
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed.
-- Edition: C++ only: the result scan.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(56);

-- The plan's scan of `query`: 'ours', 'function scan' or 'other'.
CREATE FUNCTION scan_of(query text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  line text;
  found text := 'other';
BEGIN
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP
    IF line LIKE '%Custom Scan (idempotency function)%' THEN found := 'ours';
    ELSIF line LIKE '%Function Scan on claim_key%' OR line LIKE '%Function Scan on complete_key%'
    THEN found := 'function scan';
    END IF;
  END LOOP;
  RETURN found;
END
$$;

-- What a claim of `key` answers, without what differs from call to call (token, times).
-- Planned at each call (EXECUTE), with the scan that idempotency.result_scan chooses then.
-- The token, if any, is left in the setting test.token.
CREATE FUNCTION answer_of(key text, fingerprint bytea DEFAULT NULL) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  answer text;
  token uuid;
BEGIN
  EXECUTE $q$SELECT concat_ws(' ', status, response, response_code, encode(c.fingerprint, 'hex'),
                               attempts, token IS NOT NULL, retry_after IS NOT NULL,
                               expires_at > created_at), token
               FROM idempotency.claim_key($1, $2) c$q$
    INTO answer, token USING key, fingerprint;
  PERFORM set_config('test.token', coalesce(token::text, ''), false);
  RETURN answer;
END
$$;

SELECT is(scan_of($$SELECT status FROM idempotency.claim_key('k')$$), 'ours',
          'a claim in FROM: our scan');
SELECT is(scan_of($$SELECT * FROM idempotency.complete_key('k', gen_random_uuid(), '{}')$$), 'ours',
          'a completion in FROM: our scan');
SET idempotency.result_scan = off;
SELECT is(scan_of($$SELECT status FROM idempotency.claim_key('k')$$), 'function scan',
          'idempotency.result_scan = off: the function scan');
RESET idempotency.result_scan;
SELECT is(scan_of($$SELECT c FROM idempotency.claim_key('k') c$$), 'function scan',
          'the row as a whole: the function scan');
SELECT is(scan_of($$SELECT * FROM idempotency.claim_key('k') WITH ORDINALITY$$), 'function scan',
          'WITH ORDINALITY: the function scan');
CREATE TABLE orders (id int);
SELECT is(scan_of($$SELECT o.id, c.status FROM orders o, idempotency.claim_key('k') c FOR UPDATE OF o$$),
          'function scan', 'FOR UPDATE (a recheck copies the answer''s whole row): the function scan');
SELECT is(scan_of($$UPDATE orders SET id = 2 FROM idempotency.claim_key('k') c WHERE c.status = 'claimed'$$),
          'function scan', 'UPDATE ... FROM: the function scan');

-- Every answer, on both scans: claimed, replay, mismatch, in_progress, and a completion.
CREATE TABLE answers (scan text, step text, answer text);
DO $$
DECLARE
  mode text;
BEGIN
  FOREACH mode IN ARRAY ARRAY['on', 'off'] LOOP
    PERFORM set_config('idempotency.result_scan', mode, true);
    INSERT INTO answers VALUES (mode, 'claimed', answer_of(mode || '-done', '\x01'));
    EXECUTE $q$INSERT INTO answers
                 SELECT $1, 'completed', concat_ws(' ', status, response, response_code, attempts)
                   FROM idempotency.complete_key($1 || '-done', $2, '{"paid": 1}', 201)$q$
      USING mode, current_setting('test.token')::uuid;
    INSERT INTO answers VALUES (mode, 'replay', answer_of(mode || '-done', '\x01'));
    INSERT INTO answers VALUES (mode, 'mismatch', answer_of(mode || '-done', '\x02'));
    INSERT INTO answers VALUES (mode, 'claimed-open', answer_of(mode || '-open'));
  END LOOP;
END
$$;
-- in_progress needs a holder in another transaction: the claims above are this one's. A
-- claim committed by this transaction holds its key for the next.
SELECT is((SELECT answer FROM answers WHERE scan = 'on' AND step = 'claimed'), 'claimed 01 1 t f t',
          'a new key: claimed, attempts 1, a token, an expiry');
SELECT is((SELECT answer FROM answers WHERE scan = 'on' AND step = 'completed'),
          'replay {"paid": 1} 201 1', 'complete_key: the stored answer');
SELECT is((SELECT answer FROM answers WHERE scan = 'on' AND step = 'replay'),
          'replay {"paid": 1} 201 01 1 f f t', 'a replay: the response, no token');
SELECT is((SELECT answer FROM answers WHERE scan = 'on' AND step = 'mismatch'), 'mismatch 01 1 f f t',
          'a mismatch: the stored fingerprint, no response');
SELECT is((SELECT count(*) FROM answers a JOIN answers b USING (step)
            WHERE a.scan = 'on' AND b.scan = 'off' AND a.answer = b.answer), 5::bigint,
          'the function scan answers the same, step by step');
SELECT is(answer_of('on-open'), 'in_progress f t', 'in_progress: retry_after, no token (our scan)');
SET idempotency.result_scan = off;
SELECT is(answer_of('off-open'), 'in_progress f t', 'in_progress: the same on the function scan');
RESET idempotency.result_scan;

-- Quals and projections on the answer.
SELECT is((SELECT count(*) FROM idempotency.claim_key('on-done') c WHERE c.status = 'replay'),
          1::bigint, 'a qual on the answer that holds: the row');
SELECT is((SELECT count(*) FROM idempotency.claim_key('on-done') c WHERE c.status = 'claimed'),
          0::bigint, 'a qual that does not: no row');
SELECT is((SELECT response->>'paid' FROM idempotency.claim_key('on-done')), '1',
          'an expression over a column');

-- LATERAL: one call per outer row, in order; the second 'l1' sees the first one's claim.
SELECT is((SELECT string_agg(v.k || ':' || c.status, ' ' ORDER BY v.n)
             FROM (VALUES (1, 'l1'), (2, 'l2'), (3, 'l1')) v(n, k),
                  LATERAL idempotency.claim_key(v.k) c),
          'l1:claimed l2:claimed l1:in_progress', 'LATERAL: one call per outer row');

-- A join clause over the answer and the outer row, which the LATERAL scan applies itself.
SELECT is((SELECT string_agg(v.k, ' ')
             FROM (VALUES ('on-done'), ('lateral-new')) v(k), LATERAL idempotency.claim_key(v.k) c
            WHERE c.status = 'replay' AND (c.response->>'paid')::int = length(v.k) - 6),
          'on-done', 'LATERAL with a clause joining the answer to the outer row');

-- An inner side that the join rescans with the same arguments: one call, the same answer for
-- every outer row (a second call would answer in_progress).
SET enable_material = off;
SELECT is(scan_of($$SELECT * FROM generate_series(1, 3) g LEFT JOIN idempotency.claim_key('rescanned') c ON g > 0$$),
          'ours', 'the inner side of a nested loop: our scan');
SELECT is((SELECT string_agg(c.status || ' ' || c.attempts, ', ')
             FROM generate_series(1, 3) g LEFT JOIN idempotency.claim_key('rescanned') c ON g > 0),
          'claimed 1, claimed 1, claimed 1', 'rescanned unchanged: one call, its answer three times');
RESET enable_material;

-- A sub-select in the arguments (docs/design.md): an uncorrelated one is an initPlan, run
-- once before the scan, whose value our scan reads as a parameter; a correlated one is a
-- SubPlan that the expression runs for each outer row, and keeps the function scan.
CREATE TABLE sub_keys (k text);
INSERT INTO sub_keys VALUES ('sub-1');
SELECT is(scan_of($$SELECT status FROM idempotency.claim_key((SELECT max(k) FROM sub_keys))$$),
          'ours', 'an uncorrelated sub-select in the arguments: our scan');
SELECT is((SELECT status::text FROM idempotency.claim_key((SELECT max(k) FROM sub_keys))),
          'claimed', 'it claims the key the sub-select gives');
SELECT is(scan_of($$SELECT c.status FROM sub_keys s, LATERAL idempotency.claim_key((SELECT s.k || '-lateral')) c$$),
          'function scan', 'a correlated sub-select in the arguments: the function scan');
SELECT is((SELECT string_agg(c.status::text, ' ')
             FROM sub_keys s, LATERAL idempotency.claim_key((SELECT s.k || '-lateral')) c),
          'claimed', 'it claims the key of the outer row');
SELECT is((SELECT string_agg(key, ' ' ORDER BY key) FROM idempotency.idempotency_keys
            WHERE key LIKE 'sub-%'), 'sub-1 sub-1-lateral', 'the two keys, once each');

-- A rescan calls again only when a PARAM_EXEC of the arguments changed. A `$n` or a PL/pgSQL
-- variable in the arguments is a Param too, with an id of its own numbering: here $1 (and
-- the PL/pgSQL variable k, its function's first datum, id 1) beside the outer row's columns
-- g.a, g.b, g.c, which the correlated sub-select reads as PARAM_EXEC 0, 1 and 2 in its quals,
-- not in the arguments. Each outer row rescans the sub-select with those changed: the claim
-- must not run again (a second call answers in_progress), as on the function scan.
SET plan_cache_mode = force_generic_plan;
PREPARE colliding(text) AS
  SELECT string_agg((SELECT c.status::text FROM idempotency.claim_key($1) c
                      WHERE c.attempts > g.a - 9 AND c.attempts > g.b - 9 AND c.attempts > g.c - 9),
                    ' ' ORDER BY g.a)
    FROM (VALUES (1, 1, 1), (2, 2, 2), (3, 3, 3)) g(a, b, c);
CREATE TEMP TABLE colliding_answers AS EXECUTE colliding('colliding-1');
SELECT is((SELECT string_agg FROM colliding_answers), 'claimed claimed claimed',
          '$1 and a PARAM_EXEC of the same number: one call for the unchanged argument');
SELECT is(scan_of($$EXECUTE colliding('colliding-x')$$), 'ours', 'on our scan');
CREATE FUNCTION colliding_in_plpgsql(k text) RETURNS text LANGUAGE plpgsql AS $f$
DECLARE
  answers text;
BEGIN
  SELECT string_agg((SELECT c.status::text FROM idempotency.claim_key(k) c
                      WHERE c.attempts > g.a - 9 AND c.attempts > g.b - 9 AND c.attempts > g.c - 9),
                    ' ' ORDER BY g.a)
    INTO answers FROM (VALUES (1, 1, 1), (2, 2, 2), (3, 3, 3)) g(a, b, c);
  RETURN answers;
END
$f$;
SELECT is(colliding_in_plpgsql('colliding-2'), 'claimed claimed claimed',
          'a PL/pgSQL variable and a PARAM_EXEC of the same number: one call');
DEALLOCATE colliding;
-- PL/pgSQL keeps its plan (our scan): planned again, with the function scan.
SET idempotency.result_scan = off;
DISCARD PLANS;
SELECT is(colliding_in_plpgsql('colliding-3'), 'claimed claimed claimed',
          'the function scan answers the same');
RESET idempotency.result_scan;
RESET plan_cache_mode;

-- A scrollable cursor reads the same row back and forth.
BEGIN;
DECLARE scrolled SCROLL CURSOR FOR SELECT status FROM idempotency.claim_key('scrolled');
MOVE NEXT IN scrolled;
MOVE PRIOR IN scrolled;
MOVE ABSOLUTE 1 IN scrolled;
MOVE BACKWARD ALL IN scrolled;
MOVE FORWARD ALL IN scrolled;
SELECT is((SELECT attempts FROM idempotency.idempotency_keys WHERE key = 'scrolled'), 1,
          'a scrollable cursor moved back and forth: one claim');
CLOSE scrolled;
COMMIT;

-- The function statistics count each call (track_functions = all), as for the function scan.
BEGIN;
SET LOCAL track_functions = 'all';
DO $$BEGIN
  PERFORM status FROM idempotency.claim_key('counted-1');
  PERFORM status FROM idempotency.claim_key('counted-2');
END$$;
SELECT is(pg_stat_get_xact_function_calls('idempotency.claim_key(text, bytea, text, interval, interval, interval)'::regprocedure),
          2::bigint, 'track_functions: two calls counted');
ROLLBACK;

-- A strict function given a NULL answers a row of NULLs without being called, as the function
-- scan does. (The NULL keys come from rows and every other argument is given: the planner
-- folds a strict call with a NULL constant, a default NULL fingerprint included.)
BEGIN;
ALTER FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval) STRICT;
SELECT is(scan_of($$SELECT * FROM (VALUES (NULL::text), (NULL)) v(k), LATERAL idempotency.claim_key(v.k, '\x01', '', '1 hour', '1 min', '0') c$$),
          'ours', 'STRICT, the key from a row: our scan');
SELECT is((SELECT count(*) FROM (VALUES (NULL::text), (NULL)) v(k),
                  LATERAL idempotency.claim_key(v.k, '\x01', '', '1 hour', '1 min', '0') c
            WHERE c.status IS NULL), 2::bigint, 'STRICT and a NULL key: a row of NULLs (our scan)');
SET LOCAL idempotency.result_scan = off;
SELECT is((SELECT count(*) FROM (VALUES (NULL::text), (NULL)) v(k),
                  LATERAL idempotency.claim_key(v.k, '\x01', '', '1 hour', '1 min', '0') c
            WHERE c.status IS NULL), 2::bigint, 'the same on the function scan');
-- A NULL after a call that answered: the row of NULLs, not the earlier call's answer again
-- (the scan's row is emptied before each call).
SET LOCAL idempotency.result_scan = on;
SELECT is(scan_of($$SELECT * FROM (VALUES (1, 'strict-after'), (2, NULL)) v(n, k), LATERAL idempotency.claim_key(v.k, '\x01', '', '1 hour', '1 min', '0') c$$),
          'ours', 'STRICT, a key and then a NULL from rows: our scan');
SELECT is((SELECT string_agg(v.n || ':' || coalesce(c.status::text, 'null') || ':' || (c.token IS NULL), ' ' ORDER BY v.n)
             FROM (VALUES (1, 'strict-after'), (2, NULL)) v(n, k),
                  LATERAL idempotency.claim_key(v.k, '\x01', '', '1 hour', '1 min', '0') c),
          '1:claimed:false 2:null:true', 'STRICT: a NULL key after a claim answers a row of NULLs, not the claim again');
ROLLBACK;

-- A function run through a wrapper (SET, SECURITY DEFINER, an fmgr hook) keeps the function
-- scan: the wrapper's duties are fmgr's.
BEGIN;
ALTER FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval)
  SET search_path = pg_catalog;
SELECT is(scan_of($$SELECT status FROM idempotency.claim_key('k')$$), 'function scan',
          'claim_key with a SET clause: the function scan');
ROLLBACK;

-- The EXECUTE privilege is checked at each execution, also of a plan made before a REVOKE.
CREATE ROLE result_scan_app;
GRANT USAGE ON SCHEMA idempotency TO result_scan_app;
SET ROLE result_scan_app;
PREPARE planned_claim(text) AS SELECT status FROM idempotency.claim_key($1);
SELECT is((SELECT status::text FROM idempotency.claim_key('app-1')), 'claimed',
          'a role with EXECUTE claims');
RESET ROLE;
REVOKE EXECUTE ON FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval)
  FROM PUBLIC;
SET ROLE result_scan_app;
SELECT throws_ok($$SELECT status FROM idempotency.claim_key('app-2')$$, '42501', NULL,
                 'without EXECUTE: 42501');
SELECT throws_ok($$EXECUTE planned_claim('app-3')$$, '42501', NULL,
                 'without EXECUTE, a statement prepared before: 42501');
RESET ROLE;
SELECT is((SELECT count(*) FROM idempotency.idempotency_keys WHERE key IN ('app-2', 'app-3')),
          0::bigint, 'and no key stored');
GRANT EXECUTE ON FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval)
  TO PUBLIC;
DEALLOCATE planned_claim;

-- The privilege is the current user's, as for the function scan: inside a SECURITY DEFINER
-- function, the definer's EXECUTE counts, not the session's user's.
CREATE ROLE result_scan_definer;
CREATE ROLE result_scan_outsider;
GRANT USAGE ON SCHEMA idempotency TO result_scan_definer, result_scan_outsider, result_scan_app;
CREATE FUNCTION claim_as_definer(k text) RETURNS text LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog AS $$
DECLARE
  answer text;
BEGIN
  SELECT status::text INTO answer FROM idempotency.claim_key(k);
  RETURN answer;
END
$$;
ALTER FUNCTION claim_as_definer(text) OWNER TO result_scan_definer;
CREATE FUNCTION claim_as_outsider(k text) RETURNS text LANGUAGE plpgsql SECURITY DEFINER
  SET search_path = pg_catalog AS $$
DECLARE
  answer text;
BEGIN
  SELECT status::text INTO answer FROM idempotency.claim_key(k);
  RETURN answer;
END
$$;
ALTER FUNCTION claim_as_outsider(text) OWNER TO result_scan_outsider;
REVOKE EXECUTE ON FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval)
  FROM PUBLIC;
GRANT EXECUTE ON FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval)
  TO result_scan_definer, result_scan_app;
SELECT is(scan_of($$SELECT status FROM idempotency.claim_key('k')$$), 'ours',
          'the definers'' query: our scan');
-- result_scan_outsider: no EXECUTE on claim_key; result_scan_definer and result_scan_app: EXECUTE.
SET ROLE result_scan_outsider;
SELECT lives_ok($$SELECT claim_as_definer('definer-1')$$,
                'a SECURITY DEFINER function whose owner has EXECUTE claims for a caller without it');
RESET ROLE;
SET ROLE result_scan_app;
SELECT throws_ok($$SELECT claim_as_outsider('definer-2')$$, '42501', NULL,
                 'a SECURITY DEFINER function whose owner lacks EXECUTE: 42501, although its caller has it');
RESET ROLE;
SELECT is((SELECT string_agg(key || ' ' || owner, ', ' ORDER BY key) FROM idempotency.idempotency_keys
            WHERE key IN ('definer-1', 'definer-2')),
          'definer-1 result_scan_definer', 'the definer''s key stored under the definer, the refused one not at all');
GRANT EXECUTE ON FUNCTION idempotency.claim_key(text, bytea, text, interval, interval, interval)
  TO PUBLIC;

-- ROWS FROM with two calls is no single call: the function scan runs both.
CREATE FUNCTION scan_or_error(query text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
  RETURN scan_of(query);
EXCEPTION WHEN OTHERS THEN
  RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;
SELECT is(scan_or_error($$SELECT * FROM ROWS FROM (idempotency.claim_key('rows-from-1'), idempotency.claim_key('rows-from-2'))$$),
          'function scan', 'ROWS FROM (claim_key(a), claim_key(b)): the function scan');
SELECT lives_ok($$CREATE TEMP TABLE rows_from AS
                    SELECT count(*) AS n FROM ROWS FROM (idempotency.claim_key('rows-from-1'), idempotency.claim_key('rows-from-2'))$$,
                'ROWS FROM of two claims runs');
SELECT is((SELECT string_agg(key || ' ' || attempts, ', ' ORDER BY key) FROM idempotency.idempotency_keys
            WHERE key LIKE 'rows-from-%'),
          'rows-from-1 1, rows-from-2 1', 'both keys claimed, once each');
-- An argument that is a correlated subquery (a SubPlan, which the function scan's expression
-- state runs) keeps the function scan; an uncorrelated one is an InitPlan, whose value reaches
-- our scan as a parameter.
SELECT is(scan_or_error($$SELECT c.status FROM (VALUES (1, 'subquery-1'), (2, 'subquery-3')) v(n, k),
                                                LATERAL idempotency.claim_key((SELECT max(x) FROM (VALUES (v.k)) t(x))) c$$),
          'function scan', 'an argument that is a correlated subquery: the function scan');
SELECT is((SELECT string_agg(v.k || ' ' || c.status, ', ' ORDER BY v.n)
             FROM (VALUES (1, 'subquery-1'), (2, 'subquery-3')) v(n, k),
                  LATERAL idempotency.claim_key((SELECT max(x) FROM (VALUES (v.k)) t(x))) c),
          'subquery-1 claimed, subquery-3 claimed', 'and the calls claim their keys');
SELECT is(scan_or_error($$SELECT status FROM idempotency.claim_key((SELECT 'subquery-2'))$$),
          'ours', 'an argument that is an uncorrelated subquery: our scan');
SELECT is((SELECT status::text FROM idempotency.claim_key((SELECT 'subquery-2'))), 'claimed',
          'and the call claims its key');

-- An error of the function comes out unchanged.
SELECT throws_ok($$SELECT status FROM idempotency.claim_key('')$$, '22023', NULL,
                 'an empty key: 22023 through our scan');
SELECT throws_ok($$SELECT status FROM idempotency.complete_key('on-open', gen_random_uuid(), '{}')$$,
                 '55000', NULL, 'a wrong token: 55000 through our scan');

-- A generic plan outlives DROP and CREATE EXTENSION: the plan depends on the function.
SET plan_cache_mode = force_generic_plan;
PREPARE generic_claim(text) AS SELECT status::text FROM idempotency.claim_key($1);
DROP TABLE answers;
CREATE TEMP TABLE generic_before AS EXECUTE generic_claim('generic-1');
DROP EXTENSION idempotency;
CREATE EXTENSION idempotency;
CREATE TEMP TABLE generic_answer AS EXECUTE generic_claim('generic-2');
SELECT is((SELECT status FROM generic_answer), 'claimed',
          'a generic plan after DROP / CREATE EXTENSION: planned again, claims');
RESET plan_cache_mode;

SELECT * FROM finish();
