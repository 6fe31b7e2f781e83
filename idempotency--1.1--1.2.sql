-- idempotency 1.1 -> 1.2: corners (security round 3, correctness, responses as sent).
-- ALTER EXTENSION idempotency UPDATE TO '1.2' runs this; CREATE EXTENSION of 1.2 runs
-- idempotency--1.0.sql, idempotency--1.0--1.1.sql and then this script, so a fresh install
-- and an upgraded one are made by the same statements.
\echo Use "ALTER EXTENSION idempotency UPDATE TO '1.2'" to load this file. \quit

-------------------------------------------------------------------------------
-- The owner of a key is the role's name (section: owner)
-------------------------------------------------------------------------------

-------------------------------------------------------------------------------
-- Monitoring and statistics (section: monitoring)
-------------------------------------------------------------------------------

-------------------------------------------------------------------------------
-- Security checks (section: security)
-------------------------------------------------------------------------------

-- No role but a superuser creates or changes anything in the extension's schema. Calls
-- refuse (42501) while another role may create objects there or while an object there is
-- not the extension's (src/installation_check.hpp); but a look-alike planted there (say
-- complete_key(text, text, text), which a call with untyped literals matches better) is
-- not the extension's code, and would run without any check of ours. This trigger refuses
-- the planting itself: any DDL command of a role that is not a superuser that creates or
-- changes an object in the schema.
CREATE FUNCTION @extschema@.guard_schema() RETURNS event_trigger
AS 'MODULE_PATHNAME', 'idempotency_guard_schema'
LANGUAGE C;
COMMENT ON FUNCTION @extschema@.guard_schema() IS
  'Event trigger function of idempotency_guard_schema: refuses (42501) a DDL command of a role '
  'that is not a superuser when it created or changed an object in the extension''s schema.';
REVOKE ALL ON FUNCTION @extschema@.guard_schema() FROM PUBLIC;

CREATE EVENT TRIGGER idempotency_guard_schema ON ddl_command_end
  EXECUTE FUNCTION @extschema@.guard_schema();
COMMENT ON EVENT TRIGGER idempotency_guard_schema IS
  'Only superusers create or change objects in the schema of extension idempotency: another '
  'role''s look-alike there could catch the calls of every role (see SECURITY.md).';
