-- pgTAP: CREATE EXTENSION then DROP EXTENSION leaves nothing behind (issue #2), also after
-- the extension was used, and it can be created again in the same session.
-- Edition: C++ only: CREATE / DROP EXTENSION.
\set ON_ERROR_STOP 1
SET client_min_messages = warning;
SELECT plan(8);

-- Every table, function and type outside the temporary and toast schemas.
CREATE FUNCTION pg_temp.catalog() RETURNS TABLE (kind text, schema text, name text) LANGUAGE sql AS $$
  SELECT 'class', n.nspname::text, relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
   WHERE n.nspname !~ '^pg_(temp|toast)'
  UNION ALL SELECT 'proc', n.nspname::text, proname::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
   WHERE n.nspname !~ '^pg_(temp|toast)'
  UNION ALL SELECT 'type', n.nspname::text, typname::text FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
   WHERE n.nspname !~ '^pg_(temp|toast)'
$$;

DROP EXTENSION idempotency;
CREATE TEMP TABLE catalog_before AS SELECT * FROM pg_temp.catalog();
-- The control file fixes the schema: no other one is accepted.
SELECT throws_ok('CREATE EXTENSION idempotency SCHEMA public', '0A000',
                 'extension "idempotency" must be installed in schema "idempotency"',
                 'CREATE EXTENSION idempotency SCHEMA public is refused');

CREATE EXTENSION idempotency;
SELECT is((SELECT status::text FROM claim_key('used-before-drop')), 'claimed', 'the extension is used');
SELECT is((SELECT status::text FROM complete_key('used-before-drop',
             (SELECT lease_token FROM idempotency.idempotency_keys WHERE key = 'used-before-drop'), '{}')),
          'replay', 'and a key completed');
SELECT cmp_ok((SELECT count(*)::int FROM pg_temp.catalog() WHERE schema = 'idempotency'), '>', 10,
              'while installed, its objects are in schema idempotency');
DROP EXTENSION idempotency;

CREATE TEMP TABLE catalog_after AS SELECT * FROM pg_temp.catalog();
SELECT is((SELECT count(*)::int FROM (SELECT * FROM catalog_after EXCEPT SELECT * FROM catalog_before) s), 0,
          'DROP EXTENSION leaves no table, function or type behind, in any schema');
SELECT is((SELECT count(*)::int FROM pg_extension WHERE extname = 'idempotency'), 0, 'the extension is gone');
SELECT is((SELECT count(*)::int FROM pg_temp.catalog() WHERE schema = 'idempotency'), 0,
          'its schema is left empty');

CREATE EXTENSION idempotency;
SELECT is((SELECT status::text FROM claim_key('used-before-drop')), 'claimed',
          'created again in the same session: a fresh table, and the C++ plans follow it');
SELECT * FROM finish();
