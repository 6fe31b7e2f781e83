// The test database: the server of the PG* environment (test/suites/client_node.sh starts
// one). Sets up, as that (super)user, the extension and an ordinary role node_test_app with
// USAGE on schema idempotency, which the tests use as an application would. Without a server
// the database tests are skipped, saying why.
'use strict';

const { Pool, Client } = require('pg');

const SKIP = 'no PostgreSQL server in the PG* environment (PGHOST, PGPORT, PGUSER, PGDATABASE): ' +
  'database tests skipped; test/suites/client_node.sh runs them against a server of its own';

let setup;
/** @returns {Promise<{ admin: Pool, app: Pool } | null>} */
function database() {
  if (!setup) setup = connect();
  return setup;
}

async function connect() {
  if (!process.env.PGHOST && !process.env.PGPORT && !process.env.PGDATABASE) return null;
  const probe = new Client({ connectionTimeoutMillis: 3000 });
  try {
    await probe.connect();
  } catch (err) {
    console.error(`# ${SKIP} (${err.message})`);
    return null;
  } finally {
    await probe.end().catch(() => {});
  }
  const admin = new Pool({ max: 4 });
  admin.on('error', () => {});
  await admin.query('CREATE EXTENSION IF NOT EXISTS idempotency');
  await admin.query(`DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'node_test_app') THEN CREATE ROLE node_test_app LOGIN; END IF;
      IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'node_test_nousage') THEN CREATE ROLE node_test_nousage LOGIN; END IF;
    END $$`);
  await admin.query('GRANT USAGE ON SCHEMA idempotency TO node_test_app');
  await admin.query(`CREATE TABLE IF NOT EXISTS node_test_payments (id bigserial PRIMARY KEY, tenant text NOT NULL,
    amount int NOT NULL, note text)`);
  await admin.query('ALTER TABLE node_test_payments OWNER TO node_test_app');
  await admin.query('CREATE TABLE IF NOT EXISTS node_test_effects (message_id text, consumer text, amount int)');
  await admin.query('ALTER TABLE node_test_effects OWNER TO node_test_app');
  const app = new Pool({ user: 'node_test_app', max: 30 });
  app.on('error', () => {});
  return { admin, app };
}

async function closeDatabase() {
  const db = await setup;
  if (db) await Promise.all([db.admin.end(), db.app.end()]);
}

/** A prefix unique to this run (keys and tenants of earlier runs do not interfere). */
const RUN = `${process.pid}-${Date.now().toString(36)}`;

module.exports = { database, closeDatabase, SKIP, RUN };
