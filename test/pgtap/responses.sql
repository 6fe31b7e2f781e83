-- pgTAP: responses replayed as sent (issue #24). complete_key / complete_keys store a body's
-- exact bytes and its headers beside the jsonb response; a replay returns them with the code,
-- byte for byte; mismatch, in_progress, claimed and reclaimed return none of them. One size
-- limit covers the jsonb response, the body and the headers together; headers are a JSON
-- object of strings or arrays of strings (22023 otherwise); the same completion again is a
-- no-op, another under the same token 55000; every 1.1 call works unchanged.
-- On every path: the completions in the claiming statement are the direct path's (the row the
-- claim inserted, updated in place), the later ones the executor's UPDATE; on the executor
-- path (test/paths/executor.setup.sql) every write is the executor's.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(125);

-- Claims k and completes it in the same statement (the inbox pattern). (Arguments by number:
-- claim_result has a column named response.)
CREATE FUNCTION inbox(k text, response jsonb, code integer, body bytea, headers jsonb,
                      fp bytea DEFAULT NULL, scope text DEFAULT '')
RETURNS idempotency.claim_result LANGUAGE sql AS $$
  SELECT c.* FROM idempotency.claim_key($1, $6, $7) cl,
                  LATERAL idempotency.complete_key($1, cl.token, $2, $3, $7, $4, $5) c
$$;
-- Runs a statement; its SQLSTATE and message (and detail), or 'ok'.
CREATE FUNCTION try(statement text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  detail text;
BEGIN
  EXECUTE statement;
  RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS detail = PG_EXCEPTION_DETAIL;
  RETURN SQLSTATE || ': ' || SQLERRM || coalesce(' / ' || nullif(detail, ''), '');
END
$$;
-- The key row as text (to show that a refused call changed nothing).
CREATE FUNCTION row_of(k text) RETURNS text LANGUAGE sql AS $$
  SELECT t::text FROM idempotency.idempotency_keys t WHERE key = k AND owner = current_user
$$;
-- Claims of the two-phase pattern: claimed and committed here, completed later.
CREATE TABLE held (key text PRIMARY KEY, token uuid);
CREATE FUNCTION hold(VARIADIC keys text[]) RETURNS void LANGUAGE sql AS $$
  INSERT INTO held SELECT k, (idempotency.claim_key(k)).token FROM unnest(keys) k
$$;
CREATE FUNCTION token_of(k text) RETURNS uuid LANGUAGE sql AS $$ SELECT token FROM held WHERE key = k $$;
-- Incompressible bytes: n bytes of chained SHA-256 digests.
CREATE FUNCTION noise(n integer) RETURNS bytea LANGUAGE sql AS $$
  SELECT substring(string_agg(sha256(int4send(g)), ''::bytea ORDER BY g) FROM 1 FOR n)
    FROM generate_series(1, n / 32 + 1) g
$$;

-------------------------------------------------------------------------------
-- 1. Objects: the columns and fields at the end, one function of each name.
-------------------------------------------------------------------------------
SELECT is((SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
             FROM (SELECT * FROM pg_attribute WHERE attrelid = 'idempotency.idempotency_keys'::regclass
                      AND attnum > 0 AND NOT attisdropped ORDER BY attnum DESC LIMIT 5) a),
          'response_body bytea, response_headers jsonb, owner_oid oid, owner_system bigint, '
          'response_expires_at timestamp with time zone',
          'the table ends with response_body bytea, response_headers jsonb (1.2), then the owner''s stamp and the response''s expiry (1.3)');
SELECT is((SELECT count(*)::int FROM pg_attribute WHERE attrelid = 'idempotency.idempotency_keys'::regclass
             AND attname IN ('response_body', 'response_headers') AND col_description(attrelid, attnum) IS NOT NULL),
          2, 'both columns have a comment');
SELECT is((SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
             FROM pg_attribute WHERE attrelid = (SELECT typrelid FROM pg_type WHERE oid = 'idempotency.claim_result'::regtype)
              AND attnum > 0),
          'status claim_status, token uuid, response jsonb, response_code integer, fingerprint bytea, '
          'recovery_point text, attempts integer, created_at timestamp with time zone, '
          'expires_at timestamp with time zone, retry_after interval, response_body bytea, response_headers jsonb, '
          'response_dropped boolean',
          'claim_result: the fields of 1.1, then response_body and response_headers (1.2), then response_dropped (1.3)');
SELECT is((SELECT string_agg(oid::regprocedure::text || ' ' || array_to_string(proargnames[1:pronargs], ','), '; '
                             ORDER BY proname)
             FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace
              AND proname IN ('complete_key', 'complete_keys')),
          'complete_key(text,uuid,jsonb,integer,text,bytea,jsonb,interval) key,token,response,response_code,scope,'
          'response_body,response_headers,response_ttl; '
          'complete_keys(text[],uuid[],jsonb[],integer[],text,bytea[],jsonb[]) keys,tokens,responses,'
          'response_codes,scope,response_bodies,response_headers',
          'one complete_key and one complete_keys, the new arguments last');
SELECT is((SELECT string_agg(proname || ' ' || array_to_string(proargnames[array_length(proargnames, 1) - 2:], ','), '; '
                             ORDER BY proname)
             FROM pg_proc WHERE pronamespace = 'idempotency'::regnamespace AND proname IN ('claim_keys', 'complete_keys')
              AND proargmodes[array_length(proargmodes, 1) - 2:] = '{o,o,o}'),
          'claim_keys retry_after,response_body,response_headers; complete_keys retry_after,response_body,response_headers',
          'claim_keys and complete_keys return response_body and response_headers last'); 
SELECT is((SELECT string_agg(pronargdefaults::text, ',' ORDER BY proname) FROM pg_proc
            WHERE pronamespace = 'idempotency'::regnamespace AND proname IN ('complete_key', 'complete_keys')),
          '5,4', 'every argument after the third has a default');

-------------------------------------------------------------------------------
-- 2. Exact bytes, through both completions.
-------------------------------------------------------------------------------
-- Not UTF-8 at all: a NUL, 0xff, a lone continuation byte, a truncated sequence, CR LF.
CREATE TABLE bodies (name text PRIMARY KEY, body bytea);
INSERT INTO bodies VALUES
  ('binary', '\x00ff80c328fe0d0a00'),
  ('json as sent', convert_to('{"payment":7,  "account":"alice","payment":8}' || E'\n', 'UTF8')),
  ('empty', '\x'),
  ('latin1 html', convert_to('<p>Grüße</p>', 'LATIN1'));
CREATE TEMP TABLE inbox_done AS SELECT b.name, i.* FROM bodies b, LATERAL inbox('ib-' || name, NULL, 201, body, NULL) i;
SELECT is((SELECT string_agg(name, ',' ORDER BY name) FROM inbox_done i JOIN bodies b USING (name)
            WHERE i.response_body = b.body AND i.status = 'replay' AND i.response_code = 201),
          'binary,empty,json as sent,latin1 html', 'inbox: complete_key returns each body as given');
SELECT is((SELECT string_agg(name, ',' ORDER BY name) FROM bodies b
            WHERE (claim_key('ib-' || name)).response_body = b.body),
          'binary,empty,json as sent,latin1 html', 'inbox: the replay returns the same bytes');
SELECT is((SELECT string_agg(name, ',' ORDER BY name) FROM bodies b JOIN idempotency_keys k ON k.key = 'ib-' || name
            WHERE k.response_body = b.body AND k.response IS NULL AND k.response_headers IS NULL),
          'binary,empty,json as sent,latin1 html', 'inbox: the stored row holds the bytes, and no jsonb response');
SELECT hold('tp-binary', 'tp-json as sent', 'tp-empty', 'tp-latin1 html');
CREATE TEMP TABLE two_phase_done AS
  SELECT b.name, c.* FROM bodies b, LATERAL complete_key('tp-' || name, token_of('tp-' || name), NULL, 200, '', body) c;
SELECT is((SELECT string_agg(name, ',' ORDER BY name) FROM two_phase_done t JOIN bodies b USING (name)
            WHERE t.response_body = b.body),
          'binary,empty,json as sent,latin1 html', 'two-phase: complete_key returns each body as given');
SELECT is((SELECT string_agg(name, ',' ORDER BY name) FROM bodies b
            WHERE (claim_key('tp-' || name)).response_body = b.body),
          'binary,empty,json as sent,latin1 html', 'two-phase: the replay returns the same bytes');
SELECT is((SELECT convert_from(response_body, 'UTF8') FROM claim_key('ib-json as sent')),
          '{"payment":7,  "account":"alice","payment":8}' || E'\n',
          'a JSON body comes back as sent: key order, the duplicate key, spacing and newline kept');
SELECT is((SELECT row(octet_length(response_body), response_body IS NULL)::text FROM claim_key('ib-empty')),
          '(0,f)', 'an empty body is replayed as an empty body, not as NULL');
SELECT is((SELECT get_byte(response_body, 0) || ',' || get_byte(response_body, 1) || ',' || octet_length(response_body)
             FROM claim_key('tp-binary')), '0,255,9', 'a body starting with a NUL byte keeps all 9 bytes');

-- A body beside a jsonb response, headers without a body, and neither (the 1.1 outcome).
SELECT is((SELECT row(status, response, response_code, response_body, response_headers)::text
             FROM inbox('both', '{"id": 7}', 201, '\x6f6b', '{"Location": "/payments/7"}')),
          '(replay,"{""id"": 7}",201,"\\x6f6b","{""Location"": ""/payments/7""}")',
          'a jsonb response, a body and headers are stored together');
SELECT is((SELECT row(status, response, response_code, response_body, response_headers)::text FROM claim_key('both')),
          '(replay,"{""id"": 7}",201,"\\x6f6b","{""Location"": ""/payments/7""}")', 'and replayed together');
SELECT is((SELECT row(response_body, response_headers)::text FROM inbox('headers-only', NULL, 204, NULL, '{"ETag": "\"v1\""}')),
          '(,"{""ETag"": ""\\""v1\\""""}")', 'headers without a body');
SELECT is((SELECT row(response_code, response_body IS NULL, response_headers)::text FROM claim_key('headers-only')),
          '(204,t,"{""ETag"": ""\\""v1\\""""}")', 'replayed: code and headers, no body');
SELECT is((SELECT row(response, response_body, response_headers)::text FROM inbox('jsonb-only', '{"a": 1}', 200, NULL, NULL)),
          '("{""a"": 1}",,)', 'a jsonb response alone: no body, no headers');

-- Large bodies: at the default limit (1 MB, counted with the 4-byte header) exactly, and one
-- byte over. Incompressible, so the stored row points to TOAST.
CREATE TABLE big AS SELECT noise(1048572) AS body;
SELECT is((SELECT octet_length(body) + 4 FROM big), 1048576, 'a body of 1048572 bytes is a datum of 1048576 bytes');
SELECT is((SELECT md5(response_body) FROM inbox('big-inbox', NULL, 200, (SELECT body FROM big), NULL)),
          (SELECT md5(body) FROM big), 'inbox: a body of exactly idempotency.max_response_size is stored');
SELECT is((SELECT md5(response_body) FROM claim_key('big-inbox')), (SELECT md5(body) FROM big), 'and replayed whole');
SELECT ok((SELECT pg_column_size(response_body) > 1000000 FROM idempotency_keys WHERE key = 'big-inbox'),
          'stored uncompressed (it is noise)');
SELECT hold('big-two-phase', 'big-over');
SELECT is((SELECT md5(response_body) FROM complete_key('big-two-phase', token_of('big-two-phase'), NULL, 200, '',
                                                      (SELECT body FROM big))),
          (SELECT md5(body) FROM big), 'two-phase: a body of exactly the limit is stored');
SELECT is((SELECT md5(response_body) FROM claim_key('big-two-phase')), (SELECT md5(body) FROM big), 'and replayed whole');
CREATE TEMP TABLE big_over AS SELECT row_of('big-over') AS before;
SELECT is(try(format('SELECT complete_key(%L, %L, NULL, 200, %L, (SELECT body FROM big) || %L::bytea)',
                     'big-over', token_of('big-over'), '', '\x00')),
          '54000: response is too large / The response has 1048577 bytes (response 0, response_body 1048577, '
          'response_headers 0); idempotency.max_response_size is 1048576.',
          'one byte over: 54000, the detail gives the sizes');
-- Measured uncompressed: 2 MB of one byte, stored compressed to a few kB.
CREATE TABLE compressible AS SELECT convert_to(repeat('x', 2000000), 'UTF8') AS body;
SELECT ok((SELECT pg_column_size(body) < 100000 FROM compressible), 'a compressible body is stored compressed');
SELECT is(try(format('SELECT complete_key(%L, %L, NULL, 200, %L, (SELECT body FROM compressible))',
                     'big-over', token_of('big-over'), '')),
          '54000: response is too large / The response has 2000004 bytes (response 0, response_body 2000004, '
          'response_headers 0); idempotency.max_response_size is 1048576.',
          'a body is measured uncompressed: 54000');
SELECT is(row_of('big-over'), (SELECT before FROM big_over), 'the refused completions changed nothing');

-------------------------------------------------------------------------------
-- 3. Headers: an object of strings and arrays of strings, kept as given.
-------------------------------------------------------------------------------
CREATE TEMP TABLE h AS SELECT
  jsonb_build_object('Content-Type', 'text/html; charset=iso-8859-1', 'Location', '/payments/7',
                     'Set-Cookie', jsonb_build_array('b=2', 'a=1'), 'X-Empty', '', 'X-None', '[]'::jsonb,
                     'X-Tab', E'a\tb', 'X-Utf8', 'Grüße', '!#$%&''*+-.^_`|~09azAZ', 'all tchar') AS headers;
SELECT is((SELECT response_headers FROM inbox('h-1', NULL, 201, '\x', (SELECT headers FROM h))), (SELECT headers FROM h),
          'inbox: the headers are stored as given');
SELECT is((SELECT response_headers FROM claim_key('h-1')), (SELECT headers FROM h), 'and replayed');
SELECT is((SELECT response_headers -> 'Set-Cookie' FROM claim_key('h-1')), '["b=2", "a=1"]'::jsonb,
          'the values of one header keep their order');
SELECT hold('h-2');
SELECT is((SELECT response_headers FROM complete_key('h-2', token_of('h-2'), NULL, 201, '', NULL, (SELECT headers FROM h))),
          (SELECT headers FROM h), 'two-phase: the headers are stored as given');
SELECT is((SELECT response_headers FROM inbox('h-empty', NULL, 204, NULL, '{}')), '{}'::jsonb, 'an empty object: no headers');

-------------------------------------------------------------------------------
-- 4. Bad headers: 22023, naming the header, and nothing changed.
-------------------------------------------------------------------------------
SELECT hold('bad-h');
CREATE TEMP TABLE bad_h AS SELECT row_of('bad-h') AS before;
CREATE TEMP TABLE bad_headers (n serial, headers jsonb, expected text);
INSERT INTO bad_headers (headers, expected) VALUES
  ('["Location", "/p/1"]', '22023: response headers must be a JSON object / The headers are an array.'),
  ('"text/plain"', '22023: response headers must be a JSON object / The headers are a string.'),
  ('42', '22023: response headers must be a JSON object / The headers are a number.'),
  ('null', '22023: response headers must be a JSON object / The headers are null.'),
  ('{"Location": 7}', '22023: response header "Location" must be a string or an array of strings / Its value is a number.'),
  ('{"X-Flag": true}', '22023: response header "X-Flag" must be a string or an array of strings / Its value is a boolean.'),
  ('{"X-Null": null}', '22023: response header "X-Null" must be a string or an array of strings / Its value is null.'),
  ('{"A": "ok", "X-Obj": {"a": "b"}}', '22023: response header "X-Obj" must be a string or an array of strings / Its value is an object.'),
  ('{"Vary": ["Accept", 1]}', '22023: response header "Vary" must be a string or an array of strings / Element 2 of its array is a number.'),
  ('{"Vary": [["Accept"]]}', '22023: response header "Vary" must be a string or an array of strings / Element 1 of its array is an array.'),
  ('{"Bad Name": "x"}', '22023: response header name "Bad Name" is not an HTTP field name / A field name is a non-empty token (RFC 9110): letters, digits and !#$%&''*+-.^_`|~.'),
  ('{"": "x"}', '22023: response header name "" is not an HTTP field name / A field name is a non-empty token (RFC 9110): letters, digits and !#$%&''*+-.^_`|~.'),
  ('{":status": "200"}', '22023: response header name ":status" is not an HTTP field name / A field name is a non-empty token (RFC 9110): letters, digits and !#$%&''*+-.^_`|~.'),
  (E'{"X\\nY": "x"}', '22023: response header name "X\x0aY" is not an HTTP field name / A field name is a non-empty token (RFC 9110): letters, digits and !#$%&''*+-.^_`|~.'),
  (E'{"Location": "/p/1\\r\\nSet-Cookie: s=1"}', '22023: response header "Location" has a control character / Its value holds a control character other than horizontal tab, which no HTTP field value may hold.'),
  (E'{"Vary": ["Accept", "a\\nb"]}', '22023: response header "Vary" has a control character / Element 2 of its array holds a control character other than horizontal tab, which no HTTP field value may hold.'),
  (E'{"X-Del": "a\\u007fb"}', '22023: response header "X-Del" has a control character / Its value holds a control character other than horizontal tab, which no HTTP field value may hold.'),
  -- A bad header after one whose value is an array (jsonb orders keys by length): the message
  -- speaks of its value, not of an element.
  (E'{"Vary": ["Accept"], "X-Del": "a\\u007fb"}', '22023: response header "X-Del" has a control character / Its value holds a control character other than horizontal tab, which no HTTP field value may hold.'),
  ('{"Vary": ["Accept", "Origin"], "Location": 7}', '22023: response header "Location" must be a string or an array of strings / Its value is a number.');
SELECT is(try(format('SELECT complete_key(%L, %L, NULL, 200, %L, NULL, %L)', 'bad-h', token_of('bad-h'), '', headers)),
          expected, 'bad headers ' || headers::text || ': 22023')
  FROM bad_headers ORDER BY n;
SELECT is(try(format('SELECT complete_key(%L, %L, NULL, 200, %L, NULL, %L::jsonb)', 'bad-h', token_of('bad-h'), '',
                     jsonb_build_object(repeat('n', 100) || ' ', 'x'))),
          '22023: response header name "' || repeat('n', 64) || '..." is not an HTTP field name / A field name is a '
          'non-empty token (RFC 9110): letters, digits and !#$%&''*+-.^_`|~.',
          'a long name is cut to 64 bytes in the message');
SELECT is(row_of('bad-h'), (SELECT before FROM bad_h), 'the refused completions changed nothing');
SELECT is(try($$SELECT inbox('bad-h-inbox', NULL, 200, '\x01', '{"Location": 7}')$$),
          '22023: response header "Location" must be a string or an array of strings / Its value is a number.',
          'inbox: 22023 too');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key = 'bad-h-inbox'), 0, 'and its claim rolled back with it');

-------------------------------------------------------------------------------
-- 5. One limit for the jsonb response, the body and the headers together.
-------------------------------------------------------------------------------
CREATE TEMP TABLE parts AS SELECT '{"id": 7, "amount": 100}'::jsonb AS response, noise(300) AS body,
                                  '{"Location": "/payments/7", "Vary": ["Accept", "Origin"]}'::jsonb AS headers;
-- Each part counts as its datum with a 4-byte header (a value read from a table may have a
-- 1-byte one: it is counted as if it had 4).
CREATE TEMP TABLE sizes AS
  SELECT pg_column_size(response::text::jsonb) AS r, octet_length(body) + 4 AS b,
         pg_column_size(headers::text::jsonb) AS h FROM parts;
SELECT is((SELECT b FROM sizes), 304, 'the body counts 300 bytes and its 4-byte header');
SELECT set_config('idempotency.max_response_size', (SELECT r + b + h FROM sizes)::text, false) AS limit_set \gset
SELECT hold('limit-at', 'limit-over', 'limit-body', 'limit-headers');
SELECT is((SELECT status FROM complete_key('limit-at', token_of('limit-at'), (SELECT response FROM parts), 201, '',
                                           (SELECT body FROM parts), (SELECT headers FROM parts))),
          'replay', 'exactly idempotency.max_response_size in all: stored');
SELECT is((SELECT row(response, response_body, response_headers)::text FROM claim_key('limit-at')),
          (SELECT row(response, body, headers)::text FROM parts), 'and replayed whole');
SELECT is((SELECT status FROM inbox('limit-at-inbox', (SELECT response FROM parts), 201, (SELECT body FROM parts),
                                    (SELECT headers FROM parts))),
          'replay', 'inbox: exactly the limit is stored too');
SELECT set_config('idempotency.max_response_size', (SELECT r + b + h - 1 FROM sizes)::text, false) AS limit_set \gset
SELECT is(try(format('SELECT complete_key(%L, %L, %L, 201, %L, %L, %L)', 'limit-over', token_of('limit-over'),
                     (SELECT response FROM parts), '', (SELECT body FROM parts), (SELECT headers FROM parts))),
          (SELECT format('54000: response is too large / The response has %s bytes (response %s, response_body %s, '
                         'response_headers %s); idempotency.max_response_size is %s.', r + b + h, r, b, h, r + b + h - 1)
             FROM sizes),
          'one byte over in all: 54000, with each part''s size');
SELECT is(try($$SELECT inbox('limit-over-inbox', (SELECT response FROM parts), 201, (SELECT body FROM parts),
                             (SELECT headers FROM parts))$$),
          (SELECT format('54000: response is too large / The response has %s bytes (response %s, response_body %s, '
                         'response_headers %s); idempotency.max_response_size is %s.', r + b + h, r, b, h, r + b + h - 1)
             FROM sizes),
          'inbox: 54000 too');
SELECT set_config('idempotency.max_response_size', (SELECT r FROM sizes)::text, false) AS limit_set \gset
SELECT is(left(try(format('SELECT complete_key(%L, %L, %L, 201, %L, %L)', 'limit-body', token_of('limit-body'),
                          (SELECT response FROM parts), '', '\x01')), 28),
          '54000: response is too large', 'a jsonb response at the limit and a 1-byte body: 54000 (the body counts)');
SELECT is(left(try(format('SELECT complete_key(%L, %L, %L, 201, %L, NULL, %L)', 'limit-headers', token_of('limit-headers'),
                          (SELECT response FROM parts), '', '{}')), 28),
          '54000: response is too large', 'a jsonb response at the limit and empty headers: 54000 (the headers count)');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'limit-%' AND status = 'processing' AND
             response IS NULL AND response_body IS NULL AND response_headers IS NULL), 3,
          'the refused completions stored nothing');
SELECT is((SELECT count(*)::int FROM idempotency_keys WHERE key LIKE 'limit-over-inbox'), 0, 'the refused inbox claim rolled back');
RESET idempotency.max_response_size;

-------------------------------------------------------------------------------
-- 6. The same completion again is a no-op; another under the same token is 55000.
-------------------------------------------------------------------------------
SELECT hold('again');
SELECT is((SELECT status FROM complete_key('again', token_of('again'), '{"id": 1}', 201, '', '\x00ff01',
                                           '{"Location": "/p/1", "Vary": ["A", "B"]}')), 'replay', 'completed');
CREATE TEMP TABLE again_row AS SELECT xmin::text AS x, row_of('again') AS r FROM idempotency_keys WHERE key = 'again';
SELECT is((SELECT row(status, response_body, response_headers)::text
             FROM complete_key('again', token_of('again'), '{"id": 1}', 201, '', '\x00ff01',
                               '{"Vary": ["A", "B"], "Location": "/p/1"}')),
          '(replay,"\\x00ff01","{""Vary"": [""A"", ""B""], ""Location"": ""/p/1""}")',
          'the same completion again (headers in another order: equal as jsonb) is a no-op success');
SELECT is((SELECT xmin::text FROM idempotency_keys WHERE key = 'again'), (SELECT x FROM again_row), 'the no-op wrote nothing');
CREATE TEMP TABLE other_outcomes (n serial, what text, call text);
INSERT INTO other_outcomes (what, call) VALUES
  ('another body', $$'{"id": 1}', 201, '', '\x00ff02', '{"Location": "/p/1", "Vary": ["A", "B"]}'$$),
  ('a body one byte longer', $$'{"id": 1}', 201, '', '\x00ff0100', '{"Location": "/p/1", "Vary": ["A", "B"]}'$$),
  ('no body', $$'{"id": 1}', 201, '', NULL, '{"Location": "/p/1", "Vary": ["A", "B"]}'$$),
  ('an empty body', $$'{"id": 1}', 201, '', '\x', '{"Location": "/p/1", "Vary": ["A", "B"]}'$$),
  ('other headers', $$'{"id": 1}', 201, '', '\x00ff01', '{"Location": "/p/2", "Vary": ["A", "B"]}'$$),
  ('header values in another order', $$'{"id": 1}', 201, '', '\x00ff01', '{"Location": "/p/1", "Vary": ["B", "A"]}'$$),
  ('no headers', $$'{"id": 1}', 201, '', '\x00ff01', NULL$$),
  ('another code', $$'{"id": 1}', 200, '', '\x00ff01', '{"Location": "/p/1", "Vary": ["A", "B"]}'$$),
  ('no jsonb response', $$NULL, 201, '', '\x00ff01', '{"Location": "/p/1", "Vary": ["A", "B"]}'$$);
SELECT is(try(format('SELECT complete_key(%L, %L, %s)', 'again', token_of('again'), call)),
          '55000: idempotency key "again" was already completed with another response', what || ': 55000')
  FROM other_outcomes ORDER BY n;
SELECT is(row_of('again'), (SELECT r FROM again_row), 'the refused completions changed nothing');
SELECT hold('again-empty');
SELECT is((SELECT status FROM complete_key('again-empty', token_of('again-empty'), NULL, 204)), 'replay',
          'completed without a body');
SELECT is(try(format('SELECT complete_key(%L, %L, NULL, 204, %L, %L)', 'again-empty', token_of('again-empty'), '', '\x')),
          '55000: idempotency key "again-empty" was already completed with another response',
          'then with an empty body: 55000 (an empty body is not no body)');
BEGIN;
CREATE TEMP TABLE again_inbox AS SELECT * FROM claim_key('again-inbox');
SELECT is((SELECT status FROM complete_key('again-inbox', (SELECT token FROM again_inbox), NULL, 200, '', '\x01', '{"A": "1"}')),
          'replay', 'inbox: completed');
SELECT is((SELECT response_body FROM complete_key('again-inbox', (SELECT token FROM again_inbox), NULL, 200, '', '\x01', '{"A": "1"}')),
          '\x01'::bytea, 'inbox: the same completion again in the same transaction is a no-op');
SELECT is(try(format('SELECT complete_key(%L, %L, NULL, 200, %L, %L, %L)', 'again-inbox', (SELECT token FROM again_inbox), '',
                     '\x02', '{"A": "1"}')),
          '55000: idempotency key "again-inbox" was already completed with another response',
          'inbox: another body in the same transaction: 55000');
COMMIT;

-------------------------------------------------------------------------------
-- 7. Only a replay carries the stored response.
-------------------------------------------------------------------------------
SELECT is((SELECT status FROM inbox('hide', '{"secret": 1}', 201, '\x5345435245', '{"Location": "/p/9"}',
                                    request_fingerprint('first'::text))), 'replay', 'completed with a fingerprint');
SELECT is((SELECT row(status, response, response_code, response_body, response_headers)::text
             FROM claim_key('hide', request_fingerprint('other'::text))),
          '(mismatch,,,,)', 'mismatch: no response, code, body or headers');
SELECT is((SELECT row(status, response, response_code, response_body, response_headers)::text
             FROM claim_keys(ARRAY['hide'], ARRAY[request_fingerprint('other'::text)])),
          '(mismatch,,,,)', 'claim_keys, mismatch: none of them either');
SELECT is((SELECT row(status, response_body)::text FROM claim_key('hide', request_fingerprint('first'::text))),
          '(replay,"\\x5345435245")', 'the same fingerprint replays them');
SELECT is((SELECT row(status, response_body, response_headers)::text FROM claim_key('fresh')), '(claimed,,)',
          'claimed: none');
SELECT is((SELECT row(status, response_body, response_headers)::text FROM claim_key('fresh')), '(in_progress,,)',
          'in_progress: none');
SELECT release_key('fresh', (SELECT lease_token FROM idempotency_keys WHERE key = 'fresh'));
SELECT is((SELECT row(status, response_body, response_headers)::text FROM claim_key('fresh')), '(reclaimed,,)',
          'reclaimed: none');
-- An expired key that had a body and headers: claimed afresh, and the old outcome is gone.
INSERT INTO idempotency_keys (key, owner, ttl, lease, created_at, expires_at, updated_at, status, attempts,
                              response_code, response_body, response_headers)
  VALUES ('expired', current_user, '1 hour', '5 min', now() - interval '2 hours', now() - interval '1 hour', now(),
          'completed', 1, 201, '\x6f6c64', '{"Location": "/old"}');
SELECT is((SELECT row(status, response_body, response_headers)::text FROM claim_key('expired')), '(claimed,,)',
          'an expired key with a body: claimed afresh, without it');
SELECT is((SELECT row(status, response_code, response_body, response_headers)::text FROM idempotency_keys WHERE key = 'expired'),
          '(processing,,,)', 'the old code, body and headers are cleared from the row');
SELECT is((SELECT row(status, response_body, response_headers)::text FROM claim_key('expired')), '(in_progress,,)',
          'its duplicate: in_progress, without them');
SELECT is((SELECT row(status, response, response_body, response_headers)::text
             FROM complete_key('expired', (SELECT lease_token FROM idempotency_keys WHERE key = 'expired'), '{"new": 1}')),
          '(replay,"{""new"": 1}",,)', 'completed with a jsonb response only: the replay has no old body');
-- Another role's key of the same name is another key.
DROP ROLE IF EXISTS responses_other;
CREATE ROLE responses_other;
GRANT USAGE ON SCHEMA idempotency TO responses_other;
SET ROLE responses_other;
SELECT is((SELECT row(status, response_body, response_headers)::text FROM idempotency.claim_key('both')), '(claimed,,)',
          'another role: the same key is its own, nothing of the first role''s body or headers');
SELECT is((SELECT row(d.status, d.response_body, d.response_headers)::text
             FROM idempotency.claim_key('own') c,
                  LATERAL idempotency.complete_key('own', c.token, NULL, 201, '', '\x01', '{"X": "1"}') d),
          '(replay,"\\x01","{""X"": ""1""}")', 'an application role stores a body and headers of its own');
RESET ROLE;
SELECT is((SELECT row(status, response_body)::text FROM claim_key('both')), '(replay,"\\x6f6b")',
          'the first role still replays its own body');

-------------------------------------------------------------------------------
-- 8. complete_keys with bodies and headers; claim_keys replays them.
-------------------------------------------------------------------------------
SELECT hold('b-1', 'b-2', 'b-3');
CREATE TEMP TABLE batch_done AS
  SELECT * FROM complete_keys(ARRAY['b-1', 'b-2', 'b-3'], ARRAY[token_of('b-1'), token_of('b-2'), token_of('b-3')],
                              ARRAY['{"n": 1}', NULL, NULL]::jsonb[], ARRAY[201, 204, 200], '',
                              ARRAY['\x00ff', NULL, '\x']::bytea[],
                              ARRAY['{"Location": "/b/1"}', NULL, '{"Vary": ["A"]}']::jsonb[]);
SELECT is((SELECT string_agg(row(ordinality, key, status, response, response_code, response_body, response_headers)::text,
                             ' ' ORDER BY ordinality) FROM batch_done),
          '(1,b-1,replay,"{""n"": 1}",201,"\\x00ff","{""Location"": ""/b/1""}") (2,b-2,replay,,204,,) '
          '(3,b-3,replay,,200,"\\x","{""Vary"": [""A""]}")',
          'complete_keys: element i stores response_bodies[i] and response_headers[i]');
SELECT is((SELECT string_agg(row(key, status, response_body, response_headers)::text, ' ' ORDER BY ordinality)
             FROM claim_keys(ARRAY['b-3', 'b-1', 'b-2'])),
          '(b-3,replay,"\\x","{""Vary"": [""A""]}") (b-1,replay,"\\x00ff","{""Location"": ""/b/1""}") (b-2,replay,,)',
          'claim_keys replays each element''s body and headers');
SELECT is((SELECT string_agg(status::text, ',' ORDER BY ordinality)
             FROM complete_keys(ARRAY['b-1'], ARRAY[token_of('b-1')], ARRAY['{"n": 1}']::jsonb[], ARRAY[201], '',
                                ARRAY['\x00ff']::bytea[], ARRAY['{"Location": "/b/1"}']::jsonb[])),
          'replay', 'complete_keys: the same completion again is a no-op');
SELECT is(try(format('SELECT * FROM complete_keys(ARRAY[%L], ARRAY[%L::uuid], ARRAY[%L::jsonb], ARRAY[201], %L, '
                     'ARRAY[%L::bytea], ARRAY[%L::jsonb])', 'b-1', token_of('b-1'), '{"n": 1}', '', '\x00fe',
                     '{"Location": "/b/1"}')),
          '55000: idempotency key "b-1" was already completed with another response / At element 1 of keys.',
          'complete_keys: another body under the same token: 55000');
BEGIN;
CREATE TEMP TABLE batch_inbox AS SELECT * FROM claim_keys(ARRAY['bi-1', 'bi-2']);
SELECT is((SELECT string_agg(row(key, response_body, response_headers)::text, ' ' ORDER BY ordinality)
             FROM complete_keys(ARRAY['bi-1', 'bi-2'], (SELECT array_agg(token ORDER BY ordinality) FROM batch_inbox),
                                NULL, NULL, '', ARRAY['\x01', '\x02']::bytea[], NULL)),
          '(bi-1,"\\x01",) (bi-2,"\\x02",)', 'complete_keys in the claiming transaction: bodies, no headers (NULL array)');
COMMIT;
SELECT is((SELECT string_agg(encode(response_body, 'hex'), ',' ORDER BY key) FROM idempotency_keys WHERE key LIKE 'bi-%'),
          '01,02', 'and stored');
SELECT hold('bn-1');
SELECT is((SELECT row(key, response_code, response_body, response_headers)::text
             FROM complete_keys(keys => ARRAY['bn-1'], tokens => ARRAY[token_of('bn-1')], responses => NULL,
                                response_codes => ARRAY[201], response_headers => ARRAY['{"Location": "/n/1"}'::jsonb],
                                response_bodies => ARRAY['\x6e'::bytea])),
          '(bn-1,201,"\\x6e","{""Location"": ""/n/1""}")', 'complete_keys: bodies and headers by name, in any order');
SELECT hold('bv-1', 'bv-2');
CREATE TEMP TABLE batch_before AS SELECT row_of('bv-1') || row_of('bv-2') AS r;
SELECT is(try(format('SELECT * FROM complete_keys(ARRAY[%L, %L], ARRAY[%L::uuid, %L::uuid], NULL, NULL, %L, NULL, %L::jsonb[])',
                     'bv-1', 'bv-2', token_of('bv-1'), token_of('bv-2'), '', ARRAY['{"A": "1"}', '{"B": 2}']::jsonb[])),
          '22023: response header "B" must be a string or an array of strings / Its value is a number. At element 2 of keys.',
          'complete_keys: bad headers of element 2: 22023, naming the element');
SELECT is(try(format('SELECT * FROM complete_keys(ARRAY[%L, %L], ARRAY[%L::uuid, %L::uuid], NULL, NULL, %L, %L::bytea[])',
                     'bv-1', 'bv-2', token_of('bv-1'), token_of('bv-2'), '', ARRAY['\x01'])),
          '2202E: response_bodies and keys differ in length / response_bodies has 1 elements; keys has 2.',
          'complete_keys: response_bodies of another length: 2202E');
SELECT is(try(format('SELECT * FROM complete_keys(ARRAY[%L, %L], ARRAY[%L::uuid, %L::uuid], NULL, NULL, %L, NULL, %L::jsonb[])',
                     'bv-1', 'bv-2', token_of('bv-1'), token_of('bv-2'), '', ARRAY['{}', '{}', '{}']::jsonb[])),
          '2202E: response_headers and keys differ in length / response_headers has 3 elements; keys has 2.',
          'complete_keys: response_headers of another length: 2202E');
SELECT is(left(try(format('SELECT * FROM complete_keys(ARRAY[%L, %L], ARRAY[%L::uuid, %L::uuid], NULL, NULL, %L, %L::bytea[])',
                          'bv-1', 'bv-2', token_of('bv-1'), token_of('bv-2'), '', ARRAY[['\x01'], ['\x02']]::bytea[])), 56),
          '2202E: response_bodies must be a one-dimensional array /', 'complete_keys: a two-dimensional response_bodies: 2202E');
SET idempotency.max_response_size = 100;
SELECT is(try(format('SELECT * FROM complete_keys(ARRAY[%L, %L], ARRAY[%L::uuid, %L::uuid], NULL, NULL, %L, %L::bytea[])',
                     'bv-1', 'bv-2', token_of('bv-1'), token_of('bv-2'), '', ARRAY['\x01'::bytea, noise(97)])),
          '54000: response is too large / The response has 101 bytes (response 0, response_body 101, response_headers 0); '
          'idempotency.max_response_size is 100. At element 2 of keys.',
          'complete_keys: a body over the limit: 54000, naming the element');
RESET idempotency.max_response_size;
SELECT is(row_of('bv-1') || row_of('bv-2'), (SELECT r FROM batch_before), 'the refused batches changed nothing');

-------------------------------------------------------------------------------
-- 9. Every 1.1 call works unchanged.
-------------------------------------------------------------------------------
SELECT hold('old-3', 'old-4', 'old-named', 'old-untyped', 'old-prep5', 'old-prep7', 'old-6');
INSERT INTO held SELECT 'old-5', (claim_key('old-5', scope => 's')).token;
SELECT is((SELECT row(status, response, response_code, response_body, response_headers)::text
             FROM complete_key('old-3', token_of('old-3'), '{"a": 1}')), '(replay,"{""a"": 1}",,,)', '1.1 call: three arguments');
SELECT is((SELECT row(status, response_code, response_body)::text FROM complete_key('old-4', token_of('old-4'), '{}', 201)),
          '(replay,201,)', '1.1 call: four arguments');
SELECT is((SELECT row(status, response_code)::text FROM complete_key('old-5', token_of('old-5'), '{}', 202, 's')),
          '(replay,202)', '1.1 call: five arguments, the fifth is the scope');
SELECT is((SELECT status FROM complete_key(key => 'old-named', token => token_of('old-named'), response => '{"n": 1}',
                                           response_code => 200)), 'replay', '1.1 call: named arguments');
SELECT is((SELECT status FROM complete_key('old-untyped', token_of('old-untyped')::text::uuid, '{"u": 1}', 200, '')),
          'replay', '1.1 call: untyped literals are not ambiguous');
PREPARE old_typed(text, uuid, jsonb, integer, text) AS SELECT status FROM complete_key($1, $2, $3, $4, $5);
EXECUTE old_typed('old-prep5', token_of('old-prep5'), '{"p": 5}', 200, '') \gset
-- As node-postgres sends it: every parameter of unknown type.
PREPARE new_untyped AS SELECT status, response_body, response_headers FROM complete_key($1, $2, $3, $4, $5, $6, $7);
SELECT is((SELECT string_agg(parameter_types::text, '') FROM pg_prepared_statements WHERE name = 'new_untyped'),
          '{text,uuid,jsonb,integer,text,bytea,jsonb}', 'seven untyped parameters resolve to the one complete_key');
SELECT is((SELECT string_agg(parameter_types::text, '') FROM pg_prepared_statements WHERE name = 'old_typed'),
          '{text,uuid,jsonb,integer,text}', 'a prepared 1.1 call with typed parameters');
SELECT is((SELECT status FROM claim_key('old-prep5')), 'replay', 'which completed its key');
SELECT is((SELECT row(status, response_code, response_body)::text FROM complete_key('old-6', token_of('old-6'), NULL, 200, '', '\x01')),
          '(replay,200,"\\x01")', 'six positional arguments: the sixth is the body');
SELECT hold('named-new');
SELECT is((SELECT row(response_code, response_body, response_headers)::text
             FROM complete_key('named-new', token_of('named-new'), NULL, response_headers => '{"ETag": "e1"}',
                               response_code => 304, response_body => '\x')),
          '(304,"\\x","{""ETag"": ""e1""}")', 'the new arguments by name, without the scope');
SELECT is((SELECT string_agg(status::text, ',' ORDER BY ordinality)
             FROM complete_keys(ARRAY['old-prep7'], ARRAY[token_of('old-prep7')], ARRAY['{}']::jsonb[])),
          'replay', '1.1 call of complete_keys: three arguments');
SELECT is((SELECT string_agg(row(status, response_body, response_headers)::text, ',' ORDER BY ordinality)
             FROM claim_keys(ARRAY['old-3', 'old-4'])), '(replay,,),(replay,,)', '1.1 outcomes replay without body or headers');

SELECT lives_ok('DROP OWNED BY responses_other; DROP ROLE responses_other', 'the other role is dropped');

SELECT * FROM finish();
