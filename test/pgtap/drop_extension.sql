-- pgTAP: CREATE EXTENSION then DROP EXTENSION leaves nothing behind (issue #2), also after
-- the extension was used, and it can be created again in the same session.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
SELECT plan(5);

DROP EXTENSION idempotency;
CREATE TEMP TABLE catalog_before AS
  SELECT 'class' AS kind, relname::text AS name FROM pg_class WHERE relnamespace = 'public'::regnamespace
  UNION ALL SELECT 'proc', proname::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace
  UNION ALL SELECT 'type', typname::text FROM pg_type WHERE typnamespace = 'public'::regnamespace;

CREATE EXTENSION idempotency;
SELECT is((SELECT status::text FROM claim_key('used-before-drop')), 'claimed', 'the extension is used');
SELECT is((SELECT status::text FROM complete_key('used-before-drop',
             (SELECT lease_token FROM idempotency_keys WHERE key = 'used-before-drop'), '{}')),
          'replay', 'and a key completed');
DROP EXTENSION idempotency;

CREATE TEMP TABLE catalog_after AS
  SELECT 'class' AS kind, relname::text AS name FROM pg_class WHERE relnamespace = 'public'::regnamespace
  UNION ALL SELECT 'proc', proname::text FROM pg_proc WHERE pronamespace = 'public'::regnamespace
  UNION ALL SELECT 'type', typname::text FROM pg_type WHERE typnamespace = 'public'::regnamespace;
SELECT is((SELECT count(*)::int FROM (SELECT * FROM catalog_after EXCEPT SELECT * FROM catalog_before) s), 0,
          'DROP EXTENSION leaves no table, function or type behind');
SELECT is((SELECT count(*)::int FROM pg_extension WHERE extname = 'idempotency'), 0, 'the extension is gone');

CREATE EXTENSION idempotency;
SELECT is((SELECT status::text FROM claim_key('used-before-drop')), 'claimed',
          'created again in the same session: a fresh table, and the C++ plans follow it');
SELECT * FROM finish();
