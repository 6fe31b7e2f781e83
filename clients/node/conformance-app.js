// The conformance payments service (clients/conformance/CONTRACT.md), written with this
// package: configured only by environment variables (DATABASE_URL, LISTEN, IDEM_MODE,
// IDEM_STORE_ERRORS, IDEM_WAIT_MS, IDEM_LEASE_SECONDS, IDEM_TTL_SECONDS).
//   node clients/node/conformance-app.js
'use strict';

const crypto = require('node:crypto');
const express = require('express');
const { Pool } = require('pg');
const { idempotency } = require('.');
const { clientConfig } = require('./lib/dsn');

const env = process.env;
const mode = env.IDEM_MODE || 'inbox';
const pool = new Pool({ ...clientConfig(env.DATABASE_URL || ''), max: 60 });
pool.on('error', (err) => console.error('idle connection lost:', err.message)); // e.g. a server restart

const idem = idempotency({
  pool,
  mode: mode === 'two_phase' ? 'two_phase' : 'inbox',
  policyUrl: '/idempotency-policy',
  scope: (req) => req.get('X-Tenant') || 'default',
  storeErrors: env.IDEM_STORE_ERRORS === '1',
  waitMs: Number(env.IDEM_WAIT_MS || 0),
  leaseSeconds: Number(env.IDEM_LEASE_SECONDS || 30),
  ttlSeconds: Number(env.IDEM_TTL_SECONDS || 86400),
  onError: (err) => console.error('error:', err.message),
});

const app = express();
app.get('/healthz', (_req, res) => { res.type('text/plain').send('ok'); });
app.get('/idempotency-policy', idem.policy);

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// The effect's connection: the claim's transaction (inbox), or its own (two-phase: an
// outside effect, autocommit).
const db = (req) => (mode === 'two_phase' ? pool : req.idempotency.client);
const tenant = (req) => req.get('X-Tenant') || 'default';

app.post('/payments', idem, async (req, res) => {
  const sleepMs = Number(req.get('X-Sleep-Ms') || 0);
  if (sleepMs > 0) await sleep(sleepMs);
  const fail = req.get('X-Fail');
  if (fail === 'raise') throw new Error('the handler raised (X-Fail: raise)');
  if (fail === '503') return res.status(503).json({ error: 'unavailable' });
  if (fail === '400') return res.status(400).json({ error: 'bad amount' });
  const { amount, note } = req.body || {};
  const { rows: [row] } = await db(req).query(
    'INSERT INTO payments (tenant, amount, note) VALUES ($1::text, $2::int, $3::text) RETURNING id',
    [tenant(req), amount, note ?? null]);
  const id = Number(row.id);
  res.status(201)
    .set('Location', `/payments/${id}`)
    .set('X-Request-Nonce', crypto.randomUUID())
    .json({ id, tenant: tenant(req), amount });
});

app.post('/echo', idem, async (req, res) => {
  const body = req.rawBody;
  await db(req).query("INSERT INTO payments (tenant, amount, note) VALUES ($1::text, $2::int, 'echo')",
    [tenant(req), body.length]);
  res.status(200)
    .set('Content-Type', req.get('Content-Type') || 'application/octet-stream')
    .set('X-Request-Nonce', crypto.randomUUID())
    .send(body);
});

app.use((req, res) => { res.status(404).type('text/plain').send('not found'); });
// A handler's exception: 500 problem+json (not stored unless IDEM_STORE_ERRORS=1).
app.use(idem.errorHandler);

const [host, port] = (env.LISTEN || '127.0.0.1:8080').split(/:(?=\d+$)/);
const server = app.listen(Number(port), host, () => console.log(`listening on ${host}:${port} (${mode})`));
const stop = () => server.close(() => pool.end());
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
