-- pgTAP: every bounded value at exactly its limit and one unit over (issue #22): key and
-- scope length, fingerprint, recovery point, response size, ttl and lease, each with the
-- default limit and with a limit set explicitly, and ttl / lease given explicitly and taken
-- from their default settings. At the limit: accepted (and stored as given); one over: the
-- documented SQLSTATE, and nothing stored.
-- Run by test/run.sh in a fresh database with pgtap and idempotency installed.
-- On every path: run as it is and with the table on the executor path
-- (test/paths/executor.setup.sql); the result lines must be the same.
\set ON_ERROR_STOP 1
\pset format unaligned
\pset tuples_only on
SET client_min_messages = warning;

SELECT plan(77);

-- The number of rows of the calling role's keys named k (in any scope).
CREATE FUNCTION rows_of(k text) RETURNS int LANGUAGE sql AS
  $$ SELECT count(*)::int FROM idempotency.idempotency_keys WHERE key = k $$;

-- A claim of k by `call` (claim_key or claim_keys, default ttl and lease) with `setting` at
-- `value` for its transaction: how long the key lives and its lease, or how it failed.
CREATE FUNCTION claim_with(setting text, value text, call text, k text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE state text; message text; result text; old text := coalesce(current_setting(setting, true), '');
BEGIN
  PERFORM set_config(setting, value, true);
  BEGIN
    EXECUTE CASE call WHEN 'claim_key' THEN 'SELECT idempotency.claim_key($1)'
                      ELSE 'SELECT * FROM idempotency.claim_keys(ARRAY[$1])' END USING k;
    result := (SELECT format('expires %s, lease %s', expires_at - created_at, locked_until - created_at)
                 FROM idempotency.idempotency_keys WHERE key = k);
  EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS state = RETURNED_SQLSTATE, message = MESSAGE_TEXT;
    result := format('ERROR %s %s', state, message);
  END;
  -- Back as it was: the next case of the same statement starts from the defaults.
  PERFORM set_config(setting, old, true);
  RETURN result;
END $$;

-------------------------------------------------------------------------------
-- 1. Key and scope length, in bytes (idempotency.max_key_length, 255 by default).
-------------------------------------------------------------------------------
SELECT is((claim_key(repeat('k', 255))).status, 'claimed', 'key: 255 bytes (the default limit) is accepted');
SELECT throws_ok($$SELECT claim_key(repeat('K', 256))$$, '22001', 'idempotency key is too long',
                 'key: 256 bytes is refused (22001)');
-- 'é' is two bytes in UTF-8: the limit counts bytes, not characters.
SELECT is((claim_key(repeat('é', 127) || 'x')).status, 'claimed', 'key: 255 bytes of 128 characters is accepted');
SELECT throws_ok($$SELECT claim_key(repeat('é', 128))$$, '22001', NULL, 'key: 256 bytes of 128 characters is refused');
SELECT is((claim_key('scope-at-limit', scope => repeat('s', 255))).status, 'claimed',
          'scope: 255 bytes is accepted');
SELECT is((SELECT octet_length(scope) FROM idempotency_keys WHERE key = 'scope-at-limit'), 255, 'scope: stored whole');
SELECT throws_ok($$SELECT claim_key('scope-over', scope => repeat('s', 256))$$, '22001', 'idempotency scope is too long',
                 'scope: 256 bytes is refused (22001)');
SELECT is(rows_of('scope-over'), 0, 'scope: the refused claim stored nothing');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['batch-scope-over'], scope => repeat('s', 256))$$, '22001', NULL,
                 'scope: claim_keys refuses 256 bytes too');
SELECT is((SELECT status FROM claim_keys(ARRAY['batch-scope-at'], scope => repeat('s', 255))), 'claimed',
          'scope: claim_keys accepts 255 bytes');
SELECT throws_ok(format('SELECT complete_key(%L, %L, %L, NULL, repeat(%L, 256))', 'scope-at-limit',
                        (SELECT lease_token FROM idempotency_keys WHERE key = 'scope-at-limit'), '{}', 's'),
                 '22001', NULL, 'scope: complete_key refuses 256 bytes');
SELECT is((complete_key('scope-at-limit', (SELECT lease_token FROM idempotency_keys WHERE key = 'scope-at-limit'),
                        '{}', NULL, repeat('s', 255))).status, 'replay', 'scope: complete_key accepts 255 bytes');

SET idempotency.max_key_length = 8;
SELECT is((claim_key('12345678')).status, 'claimed', 'key: 8 bytes with max_key_length = 8 is accepted');
SELECT throws_ok($$SELECT claim_key('123456789')$$, '22001', NULL, 'key: 9 bytes with max_key_length = 8 is refused');
SELECT is((claim_key('short-sc', scope => 'abcdefgh')).status, 'claimed', 'scope: 8 bytes with max_key_length = 8 is accepted');
SELECT throws_ok($$SELECT claim_key('short-sc', scope => 'abcdefghi')$$, '22001', NULL,
                 'scope: 9 bytes with max_key_length = 8 is refused');
RESET idempotency.max_key_length;

-------------------------------------------------------------------------------
-- 2. Fingerprint (idempotency.max_fingerprint_size, 64 bytes by default), measured in bytes
--    of data whether the value was computed (4-byte header) or read from a table (1-byte).
-------------------------------------------------------------------------------
CREATE TABLE stored_fp (n int, fp bytea);
INSERT INTO stored_fp VALUES (64, decode(repeat('ab', 64), 'hex')), (65, decode(repeat('ab', 65), 'hex'));
SELECT is((claim_key('fp-64', decode(repeat('ab', 64), 'hex'))).status, 'claimed', 'fingerprint: 64 bytes is accepted');
SELECT is((SELECT length(fingerprint) FROM idempotency_keys WHERE key = 'fp-64'), 64, 'fingerprint: stored whole');
SELECT throws_ok($$SELECT claim_key('fp-65', decode(repeat('ab', 65), 'hex'))$$, '22001', 'fingerprint is too long',
                 'fingerprint: 65 bytes is refused (22001)');
SELECT is(rows_of('fp-65'), 0, 'fingerprint: the refused claim stored nothing');
SELECT is((SELECT (claim_key('fp-stored-64', fp)).status FROM stored_fp WHERE n = 64), 'claimed',
          'fingerprint: 64 bytes read from a table is accepted');
SELECT throws_ok($$SELECT claim_key('fp-stored-65', fp) FROM stored_fp WHERE n = 65$$, '22001', NULL,
                 'fingerprint: 65 bytes read from a table is refused');
SELECT is((SELECT status FROM claim_keys(ARRAY['fp-batch-64'], ARRAY[decode(repeat('ab', 64), 'hex')])), 'claimed',
          'fingerprint: claim_keys accepts 64 bytes');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['fp-batch-65'], ARRAY[decode(repeat('ab', 65), 'hex')])$$, '22001', NULL,
                 'fingerprint: claim_keys refuses 65 bytes');
SET idempotency.max_fingerprint_size = 32;
SELECT is((claim_key('fp-32', sha256('x'))).status, 'claimed', 'fingerprint: 32 bytes with max_fingerprint_size = 32 is accepted');
SELECT throws_ok($$SELECT claim_key('fp-33', sha256('x') || '\x00'::bytea)$$, '22001', NULL,
                 'fingerprint: 33 bytes with max_fingerprint_size = 32 is refused');
RESET idempotency.max_fingerprint_size;

-------------------------------------------------------------------------------
-- 3. Recovery point (idempotency.max_recovery_point_size, 1024 bytes by default).
-------------------------------------------------------------------------------
CREATE TEMP TABLE rp AS SELECT token FROM claim_key('rp-key');
SELECT ok(checkpoint_key('rp-key', (SELECT token FROM rp), repeat('r', 1024)) IS NOT NULL,
          'recovery point: 1024 bytes is accepted');
SELECT is((SELECT octet_length(recovery_point) FROM idempotency_keys WHERE key = 'rp-key'), 1024, 'recovery point: stored whole');
SELECT throws_ok(format('SELECT checkpoint_key(%L, %L, repeat(%L, 1025))', 'rp-key', (SELECT token FROM rp), 'R'),
                 '22001', 'recovery point is too long', 'recovery point: 1025 bytes is refused (22001)');
SELECT is((SELECT recovery_point = repeat('r', 1024) FROM idempotency_keys WHERE key = 'rp-key'), true,
          'recovery point: the refused checkpoint changed nothing');
SET idempotency.max_recovery_point_size = 10;
SELECT ok(checkpoint_key('rp-key', (SELECT token FROM rp), '0123456789') IS NOT NULL,
          'recovery point: 10 bytes with max_recovery_point_size = 10 is accepted');
SELECT throws_ok(format('SELECT checkpoint_key(%L, %L, %L)', 'rp-key', (SELECT token FROM rp), '0123456789a'),
                 '22001', NULL, 'recovery point: 11 bytes with max_recovery_point_size = 10 is refused');
RESET idempotency.max_recovery_point_size;

-------------------------------------------------------------------------------
-- 4. Response (idempotency.max_response_size, 1 MiB by default): the jsonb datum, header
--    included. A jsonb string of n characters is a datum of 12 + n bytes.
-------------------------------------------------------------------------------
SELECT is(pg_column_size(to_jsonb(repeat('x', 1048564))), 1048576, 'a jsonb string of 1048564 characters is 1 MiB');
CREATE TEMP TABLE big AS SELECT k, (claim_key(k)).token FROM unnest(ARRAY['mib-at', 'mib-over', 'mib-stored', 'mib-batch']) k;
SELECT is((complete_key('mib-at', (SELECT token FROM big WHERE k = 'mib-at'), to_jsonb(repeat('x', 1048564)))).status,
          'replay', 'response: exactly 1 MiB (the default limit) is stored');
SELECT is((SELECT length(response #>> '{}') FROM idempotency_keys WHERE key = 'mib-at'), 1048564, 'response: stored whole');
SELECT throws_ok(format('SELECT complete_key(%L, %L, to_jsonb(repeat(%L, 1048565)))', 'mib-over',
                        (SELECT token FROM big WHERE k = 'mib-over'), 'x'),
                 '54000', 'response is too large', 'response: 1 MiB + 1 byte is refused (54000)');
SELECT is((SELECT status::text FROM idempotency_keys WHERE key = 'mib-over'), 'processing', 'response: the refused completion changed nothing');
-- Read back from a table, where it is stored compressed: measured uncompressed.
CREATE TABLE stored_response (n int, r jsonb);
INSERT INTO stored_response VALUES (0, to_jsonb(repeat('x', 1048564))), (1, to_jsonb(repeat('x', 1048565)));
SELECT ok((SELECT pg_column_size(r) < 100000 FROM stored_response WHERE n = 1), 'the stored responses are compressed');
SELECT throws_ok(format('SELECT complete_key(%L, %L, r) FROM stored_response WHERE n = 1', 'mib-stored',
                        (SELECT token FROM big WHERE k = 'mib-stored')),
                 '54000', NULL, 'response: 1 MiB + 1 byte stored compressed is refused');
SELECT is((SELECT (complete_key('mib-stored', (SELECT token FROM big WHERE k = 'mib-stored'), r)).status FROM stored_response WHERE n = 0),
          'replay', 'response: 1 MiB stored compressed is accepted');
SELECT throws_ok(format('SELECT * FROM complete_keys(ARRAY[%L], ARRAY[%L]::uuid[], ARRAY[to_jsonb(repeat(%L, 1048565))])', 'mib-batch',
                        (SELECT token FROM big WHERE k = 'mib-batch'), 'x'),
                 '54000', NULL, 'response: complete_keys refuses 1 MiB + 1 byte');
SELECT is((SELECT status FROM complete_keys(ARRAY['mib-batch'], ARRAY[(SELECT token FROM big WHERE k = 'mib-batch')],
                                            ARRAY[to_jsonb(repeat('x', 1048564))])),
          'replay', 'response: complete_keys accepts exactly 1 MiB');
SET idempotency.max_response_size = 100;
CREATE TEMP TABLE small AS SELECT k, (claim_key(k)).token FROM unnest(ARRAY['small-at', 'small-over']) k;
SELECT is((complete_key('small-at', (SELECT token FROM small WHERE k = 'small-at'), to_jsonb(repeat('x', 88)))).status,
          'replay', 'response: 100 bytes with max_response_size = 100 is stored');
SELECT throws_ok(format('SELECT complete_key(%L, %L, to_jsonb(repeat(%L, 89)))', 'small-over',
                        (SELECT token FROM small WHERE k = 'small-over'), 'x'),
                 '54000', NULL, 'response: 101 bytes with max_response_size = 100 is refused');
RESET idempotency.max_response_size;

-------------------------------------------------------------------------------
-- 5. ttl (idempotency.max_ttl, 30 days by default; a month counts as 30 days), given
--    explicitly or by idempotency.default_ttl.
-------------------------------------------------------------------------------
CREATE TEMP TABLE ttl_max AS SELECT * FROM claim_key('ttl-30d', ttl => '30 days', lease => '1 min');
SELECT is((SELECT status FROM ttl_max), 'claimed', 'ttl: 30 days (the default limit) is accepted');
SELECT is((SELECT expires_at - created_at FROM ttl_max), '30 days'::interval, 'ttl: the key expires 30 days after its claim');
SELECT is((claim_key('ttl-1mon', ttl => '1 mon', lease => '1 min')).status, 'claimed', 'ttl: 1 month (30 days) is accepted');
SELECT is((claim_key('ttl-720h', ttl => '720 hours', lease => '1 min')).status, 'claimed', 'ttl: 720 hours is accepted');
SELECT throws_ok($$SELECT claim_key('ttl-over', ttl => '30 days 0.000001 s')$$, '22023', 'ttl exceeds idempotency.max_ttl',
                 'ttl: 30 days and a microsecond is refused (22023)');
SELECT throws_ok($$SELECT claim_key('ttl-over', ttl => '1 mon 0.000001 s')$$, '22023', NULL,
                 'ttl: a month and a microsecond is refused');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['ttl-over'], ttl => '30 days 0.000001 s')$$, '22023', NULL,
                 'ttl: claim_keys refuses 30 days and a microsecond');
SELECT is((SELECT status FROM claim_keys(ARRAY['ttl-batch-30d'], ttl => '30 days')), 'claimed', 'ttl: claim_keys accepts 30 days');
SELECT is(rows_of('ttl-over'), 0, 'ttl: the refused claims stored nothing');
SET idempotency.default_ttl = '2592001s';
SELECT is((claim_key('ttl-default-over', ttl => '1 hour')).status, 'claimed',
          'ttl: an explicit ttl does not use the default (over max_ttl here)');
RESET idempotency.default_ttl;
SET idempotency.max_ttl = '1h';
SELECT is((claim_key('ttl-1h', ttl => '1 hour', lease => '1 min')).status, 'claimed', 'ttl: 1 hour with max_ttl = 1h is accepted');
SELECT throws_ok($$SELECT claim_key('ttl-1h-over', ttl => '3600.000001 s', lease => '1 min')$$, '22023', NULL,
                 'ttl: 1 hour and a microsecond with max_ttl = 1h is refused');
SELECT throws_ok($$SELECT claim_key('ttl-1h-default', lease => '1 min')$$, '22023', NULL,
                 'ttl: the default (24 h) over max_ttl = 1h is refused');
RESET idempotency.max_ttl;

-------------------------------------------------------------------------------
-- 6. lease (idempotency.max_lease, 1 day by default), given explicitly, by
--    idempotency.default_lease, and to checkpoint_key.
-------------------------------------------------------------------------------
CREATE TEMP TABLE lease_max AS SELECT * FROM claim_key('lease-24h', lease => '24 hours');
SELECT is((SELECT status FROM lease_max), 'claimed', 'lease: 24 hours (the default limit) is accepted');
SELECT is((SELECT locked_until - created_at FROM idempotency_keys WHERE key = 'lease-24h'), '24 hours'::interval,
          'lease: the lease ends 24 hours after the claim');
SELECT is((claim_key('lease-1d', lease => '1 day')).status, 'claimed', 'lease: 1 day is accepted');
SELECT throws_ok($$SELECT claim_key('lease-over', lease => '24 hours 0.000001 s')$$, '22023', 'lease exceeds idempotency.max_lease',
                 'lease: 24 hours and a microsecond is refused (22023)');
SELECT throws_ok($$SELECT * FROM claim_keys(ARRAY['lease-over'], lease => '1 day 0.000001 s')$$, '22023', NULL,
                 'lease: claim_keys refuses a day and a microsecond');
SELECT is((SELECT status FROM claim_keys(ARRAY['lease-batch-1d'], lease => '1 day')), 'claimed', 'lease: claim_keys accepts 1 day');
SELECT is(rows_of('lease-over'), 0, 'lease: the refused claims stored nothing');
SELECT ok(checkpoint_key('lease-24h', (SELECT token FROM lease_max), 'step', lease => '24 hours') IS NOT NULL,
          'lease: checkpoint_key accepts 24 hours');
SELECT throws_ok(format('SELECT checkpoint_key(%L, %L, %L, lease => %L)', 'lease-24h', (SELECT token FROM lease_max), 'step-2',
                        '24 hours 0.000001 s'),
                 '22023', NULL, 'lease: checkpoint_key refuses 24 hours and a microsecond');
SELECT is((SELECT recovery_point FROM idempotency_keys WHERE key = 'lease-24h'), 'step', 'lease: the refused checkpoint changed nothing');
-- ttl and lease taken from idempotency.default_ttl / default_lease: at max_ttl / max_lease
-- accepted, a second over refused.
SELECT is(claim_with(setting, value, call, k), expected, what)
  FROM (VALUES ('idempotency.default_ttl', '30d', 'claim_key', 'ttl-default-30d', 'expires 30 days, lease 00:05:00',
                'ttl: a default_ttl of exactly max_ttl is accepted'),
               ('idempotency.default_ttl', '2592001s', 'claim_key', 'ttl-default-over',
                'ERROR 22023 idempotency.default_ttl exceeds idempotency.max_ttl',
                'ttl: a default_ttl one second over max_ttl is refused (22023)'),
               ('idempotency.default_ttl', '2592001s', 'claim_keys', 'ttl-default-over',
                'ERROR 22023 idempotency.default_ttl exceeds idempotency.max_ttl',
                'ttl: claim_keys refuses it too'),
               ('idempotency.default_lease', '24h', 'claim_key', 'lease-default-24h', 'expires 1 day, lease 1 day',
                'lease: a default_lease of exactly max_lease is accepted'),
               ('idempotency.default_lease', '86401s', 'claim_key', 'lease-default-over',
                'ERROR 22023 idempotency.default_lease exceeds idempotency.max_lease',
                'lease: a default_lease one second over max_lease is refused (22023)'),
               ('idempotency.default_lease', '86401s', 'claim_keys', 'lease-default-over',
                'ERROR 22023 idempotency.default_lease exceeds idempotency.max_lease',
                'lease: claim_keys refuses it too')) AS cases(setting, value, call, k, expected, what);
SET idempotency.max_lease = '10min';
SELECT is((claim_key('lease-10min', lease => '10 min')).status, 'claimed', 'lease: 10 min with max_lease = 10min is accepted');
SELECT throws_ok($$SELECT claim_key('lease-10min-over', lease => '600.000001 s')$$, '22023', NULL,
                 'lease: 10 min and a microsecond with max_lease = 10min is refused');
SELECT is((claim_key('lease-10min-default')).status, 'claimed', 'lease: the default (5 min) under max_lease = 10min is accepted');
SET idempotency.default_lease = '601s';
SELECT throws_ok($$SELECT claim_key('lease-10min-default-over')$$, '22023', NULL,
                 'lease: a default_lease of 601 s with max_lease = 10min is refused');
RESET idempotency.default_lease;
RESET idempotency.max_lease;

SELECT * FROM finish();
