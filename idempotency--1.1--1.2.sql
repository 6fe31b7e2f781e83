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
