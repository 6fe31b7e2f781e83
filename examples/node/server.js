// An HTTP endpoint that honours the IETF `Idempotency-Key` header
// (draft-ietf-httpapi-idempotency-key-header) with the idempotency PostgreSQL extension.
//
//   POST /payments   {"account": "alice", "amount": 100}   Idempotency-Key: <unique key>
//   GET  /accounts/:id                                     (safe: needs no key)
//
// Pattern: INBOX. The effect is a write to the same database, so claim, business write
// and complete run in ONE transaction: a crash or an error anywhere rolls the key back
// with the effect, and the client's retry runs afresh. (When the effect is a call to
// an external API, use the two-phase pattern instead: claim and COMMIT, call the API,
// then complete_key in a second transaction; see the README.)
//
// claim_key's answer maps onto HTTP like this:
//   claimed / reclaimed -> run the handler; store the response exactly as sent (its status,
//                          the headers it set and its body's bytes); send it
//   replay              -> the stored status, headers and body, byte for byte, plus
//                          `Idempotent-Replayed: true`
//   in_progress         -> 409 Conflict with Retry-After (the first request is still running)
//   mismatch            -> 422 Unprocessable Content (the key was used for another payload)
//   no key on a POST    -> 400 Bad Request
//
// A replay is the same bytes as the first answer: the body is stored as a JSON string
// (to_jsonb(text)) and sent back verbatim (response #>> '{}'), so clients that sign or compare
// bodies see no difference (a jsonb value would come back with its keys reordered).
//
// Connection: the usual PG* environment variables (PGHOST, PGPORT, PGDATABASE, PGUSER,
// PGPASSWORD) or DATABASE_URL, as an ordinary application role. Listens on 127.0.0.1, port
// PORT (default 3000). EXAMPLE_EFFECT_DELAY_MS keeps each payment's transaction open that
// long, so that a duplicate sent meanwhile sees the claim in flight (409).
//
// The extension lives in its own schema, `idempotency`; the one grant the application role
// needs is `GRANT USAGE ON SCHEMA idempotency TO app` (by a superuser), and the functions are
// called schema-qualified (idempotency.claim_key, ...). `--setup` creates the tables, as the
// server's role (the owner of its database may), or with SETUP_DATABASE_URL as another role,
// which then grants them to the server's role.
'use strict';

const http = require('node:http');
const { Client, Pool } = require('pg');

const pool = new Pool(process.env.DATABASE_URL ? { connectionString: process.env.DATABASE_URL } : {});
// Keeps the transaction open a while, so that duplicates arrive in flight (the 409 case).
const effectDelayMs = Number(process.env.EXAMPLE_EFFECT_DELAY_MS || 0);
const MAX_KEY_LENGTH = 255; // idempotency.max_key_length

const setupSql = `
  CREATE EXTENSION IF NOT EXISTS idempotency;
  CREATE TABLE IF NOT EXISTS api_accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
  CREATE TABLE IF NOT EXISTS api_payments (
    id bigserial PRIMARY KEY, account text NOT NULL, amount bigint NOT NULL,
    idempotency_key text NOT NULL, at timestamptz NOT NULL DEFAULT now());`;
// When another role sets up: the one grant the extension needs, and the business tables.
const grantSql = (role) => `
  GRANT USAGE ON SCHEMA idempotency TO ${role};
  GRANT SELECT, INSERT, UPDATE ON api_accounts, api_payments TO ${role};
  GRANT USAGE ON SEQUENCE api_payments_id_seq TO ${role};`;

// A response as it goes on the wire: status, the headers its handler set, and the body's bytes.
function jsonResponse(status, body, headers = {}) {
  return {
    status,
    headers: { 'Content-Type': status >= 400 ? 'application/problem+json' : 'application/json', ...headers },
    body: Buffer.from(JSON.stringify(body)),
  };
}

function write(res, { status, headers, body }, extra = {}) {
  res.writeHead(status, { ...headers, 'Content-Length': body.length, ...extra });
  res.end(body);
}

function send(res, status, body, headers = {}) {
  write(res, jsonResponse(status, body, headers));
}

function problem(res, status, title, detail, headers) {
  send(res, status, { type: 'about:blank', title, status, detail }, headers);
}

function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

// The business effect. Runs only for a claimed key, inside the claim's transaction.
async function createPayment(client, key, payment) {
  const { rows } = await client.query(
    `INSERT INTO api_accounts (id, balance) VALUES ($1, $2)
       ON CONFLICT (id) DO UPDATE SET balance = api_accounts.balance + EXCLUDED.balance
     RETURNING balance`,
    [payment.account, payment.amount]);
  const ins = await client.query(
    'INSERT INTO api_payments (account, amount, idempotency_key) VALUES ($1, $2, $3) RETURNING id',
    [payment.account, payment.amount, key]);
  if (effectDelayMs) await new Promise((r) => setTimeout(r, effectDelayMs));
  const id = Number(ins.rows[0].id);
  return jsonResponse(201,
    { payment: id, account: payment.account, amount: payment.amount, balance: Number(rows[0].balance) },
    { Location: `/payments/${id}` });
}

async function postPayment(req, res) {
  const key = req.headers['idempotency-key'];
  if (key === undefined || key === '') {
    return problem(res, 400, 'Idempotency-Key missing', 'POST /payments needs an Idempotency-Key header.');
  }
  if (Buffer.byteLength(key) > MAX_KEY_LENGTH) {
    return problem(res, 400, 'Idempotency-Key too long', `At most ${MAX_KEY_LENGTH} bytes.`);
  }
  const raw = await readBody(req);
  let payment;
  try {
    payment = JSON.parse(raw);
  } catch {
    return problem(res, 400, 'Invalid JSON', 'The body must be a JSON object.');
  }
  if (typeof payment !== 'object' || payment === null || typeof payment.account !== 'string' ||
      !Number.isInteger(payment.amount) || payment.amount <= 0) {
    return problem(res, 400, 'Invalid payment', 'Expected {"account": string, "amount": positive integer}.');
  }

  const scope = 'POST /payments'; // keys are unique per endpoint (add the client id in a real API)
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    // The fingerprint is computed from the body as jsonb, so the same payload sent with
    // another key order or spacing is still the same request.
    const { rows: [claim] } = await client.query(
      `SELECT status::text, token, response_code, response_body, response_headers,
              ceil(extract(epoch FROM retry_after))::int AS retry_after
         FROM idempotency.claim_key($1::text, idempotency.request_fingerprint($2::jsonb), $3::text)`,
      [key, raw, scope]);

    switch (claim.status) {
      case 'claimed':
      case 'reclaimed': {
        const response = await createPayment(client, key, payment);
        // Stored as sent: the status, the headers the handler set (not Content-Length, which
        // follows from the body) and the body's bytes (a Buffer is sent as bytea).
        await client.query(
          `SELECT idempotency.complete_key($1::text, $2::uuid, NULL, $3::int, $4::text,
                                           response_body => $5::bytea, response_headers => $6::jsonb)`,
          [key, claim.token, response.status, scope, response.body, JSON.stringify(response.headers)]);
        await client.query('COMMIT');
        return write(res, response);
      }
      case 'replay':
        await client.query('ROLLBACK'); // a replay wrote nothing; end the transaction
        // node-postgres gives bytea as a Buffer and jsonb parsed: the bytes are the first response's.
        return write(res, { status: claim.response_code, headers: claim.response_headers, body: claim.response_body },
          { 'Idempotent-Replayed': 'true' });
      case 'in_progress':
        await client.query('ROLLBACK');
        return problem(res, 409, 'Request in progress',
          'A request with this Idempotency-Key is still being processed; retry later.',
          { 'Retry-After': String(Math.max(1, claim.retry_after || 1)) });
      case 'mismatch':
        await client.query('ROLLBACK');
        return problem(res, 422, 'Idempotency-Key reused',
          'This Idempotency-Key was used with a different request payload.');
      default:
        throw new Error(`unexpected claim status ${claim.status}`);
    }
  } catch (err) {
    // The transaction rolls back with the claim: a retry with the same key runs afresh.
    await client.query('ROLLBACK').catch(() => {});
    console.error(err);
    return problem(res, 500, 'Internal error', 'Nothing was stored; retrying with the same key is safe.');
  } finally {
    client.release();
  }
}

async function getAccount(res, id) {
  const { rows } = await pool.query(
    `SELECT a.balance, (SELECT count(*) FROM api_payments p WHERE p.account = a.id) AS payments
       FROM api_accounts a WHERE a.id = $1`, [id]);
  if (rows.length === 0) return problem(res, 404, 'Not found', `No account ${id}.`);
  return send(res, 200, { account: id, balance: Number(rows[0].balance), payments: Number(rows[0].payments) });
}

const server = http.createServer((req, res) => {
  const url = new URL(req.url, 'http://localhost');
  let work;
  if (req.method === 'POST' && url.pathname === '/payments') work = postPayment(req, res);
  else if (req.method === 'GET' && url.pathname.startsWith('/accounts/')) {
    work = getAccount(res, decodeURIComponent(url.pathname.slice('/accounts/'.length)));
  } else work = Promise.resolve(problem(res, 404, 'Not found', `${req.method} ${url.pathname}`));
  work.catch((err) => {
    console.error(err);
    if (!res.headersSent) problem(res, 500, 'Internal error', 'Unexpected error.');
  });
});

// One-time setup of the tables, for the role this server connects as.
async function setup() {
  if (!process.env.SETUP_DATABASE_URL) return pool.query(setupSql);
  const { rows: [{ role }] } = await pool.query('SELECT quote_ident(current_user) AS role');
  const admin = new Client({ connectionString: process.env.SETUP_DATABASE_URL });
  await admin.connect();
  try {
    await admin.query(setupSql);
    const { rows: [{ adminRole }] } = await admin.query('SELECT quote_ident(current_user) AS "adminRole"');
    if (adminRole !== role) await admin.query(grantSql(role));
  } finally {
    await admin.end();
  }
}

async function main() {
  if (process.argv.includes('--setup')) await setup();
  const port = Number(process.env.PORT || 3000);
  server.listen(port, '127.0.0.1', () => console.log(`listening on http://127.0.0.1:${port}`));
}

process.on('SIGTERM', () => server.close(() => pool.end()));
process.on('SIGINT', () => server.close(() => pool.end()));

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
