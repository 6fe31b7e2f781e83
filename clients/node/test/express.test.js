// The Express middleware against a real server (the PG* environment; skipped without one):
// real HTTP requests on 127.0.0.1. node --test test/express.test.js
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const express = require('express');
const { Pool } = require('pg');
const { idempotency, policyHandler } = require('..');
const { database, closeDatabase, SKIP, RUN } = require('./db');

const POLICY = 'https://api.example/idempotency';

/** Requests held in their handler, by tenant/key: { entered, release } gates. */
const held = new Map();
/** A deferred: resolve it from outside (a barrier between a handler and the test). */
function gate() {
  let open;
  const promise = new Promise((r) => { open = r; });
  return { promise, open };
}

/**
 * An app on 127.0.0.1 with the middleware (options) on POST/PATCH /payments and /echo; the
 * handler is hooks.handler or the default payment. Returns { url, close, hooks }.
 */
async function startApp(pool, options = {}, hooks = {}) {
  const errors = [];
  const idem = idempotency({ pool, policyUrl: POLICY, scope: (req) => req.get('X-Tenant') || 'default',
    onError: (e) => errors.push(e), ...options });
  const app = express();
  app.get('/policy', idem.policy);
  const pay = async (req, res) => {
    if (req.get('X-Hold')) { // held until the test releases it
      const h = held.get(`${req.get('X-Tenant')}/${req.idempotency.key}`);
      h.entered.open();
      await h.release.promise;
    }
    if (hooks.handler) return hooks.handler(req, res);
    const db = req.idempotency.client || pool;
    const { rows: [row] } = await db.query(
      'INSERT INTO node_test_payments (tenant, amount, note) VALUES ($1::text, $2::int, $3::text) RETURNING id',
      [req.get('X-Tenant') || 'default', req.body.amount, req.body.note ?? null]);
    res.status(201).set('Location', `/payments/${row.id}`).set('X-Nonce', String(Math.random())).json({ id: Number(row.id) });
  };
  app.post('/payments', idem, pay);
  app.patch('/payments', idem, pay);
  app.get('/payments', idem, (req, res) => { res.send(req.idempotency ? 'claimed' : 'no key'); });
  app.post('/echo', idem, (req, res) => {
    res.status(200).set('Content-Type', req.get('Content-Type')).set('X-Multi', ['a', 'b']).send(req.rawBody);
  });
  app.use(idem.errorHandler);
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  const { port } = server.address();
  return { port, errors, close: () => new Promise((r) => { server.closeAllConnections(); server.close(r); }) };
}

function request(port, method, path, { body, headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
    const h = { ...(data && !Buffer.isBuffer(body) ? { 'Content-Type': 'application/json' } : {}), ...headers };
    const req = http.request({ host: '127.0.0.1', port, method, path, agent: false, headers: h }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const bytes = Buffer.concat(chunks);
        let json;
        try { json = JSON.parse(bytes.toString('utf8')); } catch { /* not JSON */ }
        resolve({ status: res.statusCode, headers: res.headers, raw: res.rawHeaders, bytes, json });
      });
    });
    req.on('error', reject);
    if (data) req.write(data);
    req.end();
  });
}

const post = (port, key, body, headers = {}) =>
  request(port, 'POST', '/payments', { body, headers: { ...(key === undefined ? {} : { 'Idempotency-Key': key }), ...headers } });

/** The headers of a response as stored and replayed: all but Date, Content-Length, Connection... */
function answerHeaders(r) {
  const skip = new Set(['date', 'connection', 'keep-alive', 'idempotent-replayed', 'transfer-encoding']);
  return Object.fromEntries(Object.entries(r.headers).filter(([k]) => !skip.has(k)).sort());
}

function assertReplay(replay, first) {
  assert.equal(replay.status, first.status);
  assert.equal(replay.headers['idempotent-replayed'], 'true');
  assert.ok(replay.bytes.equals(first.bytes), `body ${replay.bytes} is not ${first.bytes}`);
  assert.deepEqual(answerHeaders(replay), answerHeaders(first));
}

function assertProblem(r, status, title) {
  assert.equal(r.status, status);
  assert.equal(r.headers['content-type'], 'application/problem+json');
  assert.equal(r.json.type, POLICY);
  assert.equal(r.json.status, status);
  assert.match(r.json.title, title);
  assert.equal(typeof r.json.detail, 'string');
}

async function rows(db, tenant) {
  return Number((await db.admin.query('SELECT count(*) FROM node_test_payments WHERE tenant = $1', [tenant])).rows[0].count);
}

let db;
test.before(async () => { db = await database(); if (!db) console.log(`# ${SKIP}`); });
test.after(closeDatabase);

/** A test that needs the database: skipped without one. */
// A broken middleware may leave a request waiting: the timeout makes that a failure, not a hang.
function dbTest(name, fn) {
  test(name, { timeout: 60000 }, async (t) => {
    if (!db) return t.skip(SKIP);
    const app = await startApp(db.app, ...(fn.appArgs || []));
    try { await fn(t, app); } finally { await app.close(); }
  });
}
function dbTestWith(name, options, hooks, fn) { fn.appArgs = [options, hooks]; dbTest(name, fn); }

dbTest('a retry is the first answer byte for byte (status, headers, body), marked Idempotent-Replayed, one effect', async (t, app) => {
  const tenant = `replay-${RUN}`;
  const first = await post(app.port, '"k-1"', { amount: 5, note: 'x' }, { 'X-Tenant': tenant });
  assert.equal(first.status, 201);
  assert.equal(first.headers['idempotent-replayed'], undefined);
  assert.match(first.headers.location, /^\/payments\/\d+$/);
  const again = await post(app.port, 'k-1', { amount: 5, note: 'x' }, { 'X-Tenant': tenant }); // bare, same key
  assertReplay(again, first);
  // The nonce proves the handler did not run again.
  assert.equal(again.headers['x-nonce'], first.headers['x-nonce']);
  assert.equal(await rows(db, tenant), 1);
});

dbTest('JSON key order and spacing do not matter (jsonb fingerprint); another body, path or method under the key is 422 with nothing stored', async (t, app) => {
  const tenant = `fp-${RUN}`;
  const h = { 'X-Tenant': tenant };
  const first = await post(app.port, 'k-2', '{"amount": 7, "note": "n"}', h);
  assert.equal(first.status, 201);
  const reordered = await post(app.port, 'k-2', '{ "note":"n","amount":7.0 }', h);
  assertReplay(reordered, first);
  const other = await post(app.port, 'k-2', '{"amount": 8, "note": "n"}', h);
  assertProblem(other, 422, /reused/);
  assert.deepEqual(Object.keys(other.json).sort(), ['detail', 'status', 'title', 'type'], 'nothing of the stored answer');
  assert.equal(other.headers.location, undefined);
  const patch = await request(app.port, 'PATCH', '/payments', { body: '{"amount": 7, "note": "n"}', headers: { ...h, 'Idempotency-Key': 'k-2' } });
  assertProblem(patch, 422, /reused/);
  assert.equal(await rows(db, tenant), 1);
});

dbTest('missing (POST, PATCH), empty, malformed and 256-byte keys: 400 problem+json linking the policy; 255 bytes pass; GET needs none', async (t, app) => {
  const tenant = `keys-${RUN}`;
  const h = { 'X-Tenant': tenant };
  const missing = await post(app.port, undefined, { amount: 1 }, h);
  assertProblem(missing, 400, /missing/);
  assert.match(missing.json.detail, new RegExp(POLICY.replace(/[.]/g, '\\.')));
  assertProblem(await request(app.port, 'PATCH', '/payments', { body: { amount: 1 }, headers: h }), 400, /missing/);
  for (const bad of ['""', '"abc', 'a b', 'a,b', '"a\\b"', 'x'.repeat(256), `"${'x'.repeat(256)}"`]) {
    assertProblem(await post(app.port, bad, { amount: 1 }, h), 400, /Invalid Idempotency-Key/);
  }
  assert.equal(await rows(db, tenant), 0);
  assert.equal((await post(app.port, 'y'.repeat(255), { amount: 1 }, h)).status, 201);
  assert.equal((await post(app.port, `"${'z'.repeat(255)}"`, { amount: 1 }, h)).status, 201);
  assert.equal(await rows(db, tenant), 2);
  const get = await request(app.port, 'GET', '/payments');
  assert.equal(get.status, 200);
  assert.equal(get.bytes.toString(), 'no key');
});

dbTestWith('a request in flight: a duplicate gets 409 with Retry-After (whole seconds, at least 1); then the replay', {}, {}, async (t, app) => {
  const tenant = `flight-${RUN}`;
  const entered = gate();
  const release = gate();
  const first = postHeld(app, tenant, 'k-3', entered, release);
  await entered.promise;
  const dup = await post(app.port, 'k-3', { amount: 3 }, { 'X-Tenant': tenant });
  release.open();
  assertProblem(dup, 409, /in progress/);
  assert.match(dup.headers['retry-after'] ?? '', /^[1-9][0-9]*$/);
  const r = await first;
  assert.equal(r.status, 201);
  assertReplay(await post(app.port, 'k-3', { amount: 3 }, { 'X-Tenant': tenant }), r);
  assert.equal(await rows(db, tenant), 1);
});

// A request whose handler signals `entered`, then waits for `release` before its effect.
function postHeld(app, tenant, key, entered, release, body = { amount: 3 }) {
  held.set(`${tenant}/${key}`, { entered, release });
  return post(app.port, key, body, { 'X-Tenant': tenant, 'X-Hold': '1' });
}

/** Resolves once n sessions of node_test_app wait inside claim_key (barrier, not a sleep). */
async function waitingClaims(n) {
  for (let i = 0; i < 2000; i++) {
    const { rows: [r] } = await db.admin.query(`SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE usename = 'node_test_app' AND state = 'active' AND query LIKE '%claim_key%' AND wait_event IS NOT NULL`);
    if (r.n >= n) return;
    await new Promise((res) => setTimeout(res, 10));
  }
  throw new Error('no claim waited');
}

dbTestWith('with waitMs, a duplicate in flight waits and gets the replay once the first completes', { waitMs: 20000 }, {}, async (t, app) => {
  const tenant = `wait-${RUN}`;
  const entered = gate();
  const release = gate();
  const first = postHeld(app, tenant, 'k-4', entered, release);
  await entered.promise;
  const dup = post(app.port, 'k-4', { amount: 3 }, { 'X-Tenant': tenant });
  await waitingClaims(1);
  release.open();
  const r = await first;
  assert.equal(r.status, 201);
  assertReplay(await dup, r);
  assert.equal(await rows(db, tenant), 1);
});

dbTest('20 concurrent duplicates: one effect; every answer 201, 409 or the replay of the 201', async (t, app) => {
  const tenant = `race-${RUN}`;
  const answers = await Promise.all(Array.from({ length: 20 }, () => post(app.port, 'k-5', { amount: 9 }, { 'X-Tenant': tenant })));
  const created = answers.filter((a) => a.status === 201 && !a.headers['idempotent-replayed']);
  assert.equal(created.length, 1);
  for (const a of answers) {
    if (a.status === 409) assertProblem(a, 409, /in progress/);
    else if (a !== created[0]) assertReplay(a, created[0]);
  }
  assert.equal(await rows(db, tenant), 1);
});

dbTestWith('a handler that throws: 500, nothing stored, its writes rolled back; the retry runs afresh', {}, {
  handler: async (req, res) => {
    await req.idempotency.client.query("INSERT INTO node_test_payments (tenant, amount) VALUES ($1::text, 1)", [req.get('X-Tenant')]);
    if (req.get('X-Fail') === 'raise') throw new Error('boom');
    if (req.get('X-Fail') === 'terminate') { // the server ends this session: a lost connection
      await db.admin.query('SELECT pg_terminate_backend($1::int)', [req.idempotency.client.processID]);
      await req.idempotency.client.query('SELECT 1');
    }
    if (req.get('X-Fail') === '503') return res.status(503).json({ error: 'unavailable' });
    if (req.get('X-Fail') === '400') return res.status(400).json({ error: 'bad amount' });
    res.status(201).json({ ok: true });
  },
}, async (t, app) => {
  const tenant = `raise-${RUN}`;
  const h = { 'X-Tenant': tenant };
  const raised = await post(app.port, 'k-6', { amount: 1 }, { ...h, 'X-Fail': 'raise' });
  assertProblem(raised, 500, /Internal error/); // idem.errorHandler
  assert.match(raised.json.detail, /nothing was stored/);
  assert.equal(await rows(db, tenant), 0, 'the handler\'s write rolled back');
  const lost = await post(app.port, 'k-6', { amount: 1 }, { ...h, 'X-Fail': 'terminate' });
  assertProblem(lost, 503, /unavailable/); // the claim's connection lost under the handler
  assert.equal(lost.headers['retry-after'], '1');
  const s503 = await post(app.port, 'k-6', { amount: 1 }, { ...h, 'X-Fail': '503' });
  assert.equal(s503.status, 503);
  assert.equal(s503.headers['idempotent-replayed'], undefined);
  const ok = await post(app.port, 'k-6', { amount: 1 }, h);
  assert.equal(ok.status, 201);
  assert.equal(ok.headers['idempotent-replayed'], undefined);
  assert.equal(await rows(db, tenant), 1);
  // A 4xx is an answer: stored and replayed.
  const bad = await post(app.port, 'k-7', { amount: 1 }, { ...h, 'X-Fail': '400' });
  assert.equal(bad.status, 400);
  assertReplay(await post(app.port, 'k-7', { amount: 1 }, h), bad);
  assert.equal(await rows(db, tenant), 2);
});

dbTestWith('storeErrors: a 5xx and an exception (as the 500 sent) are stored and replayed', { storeErrors: true }, {
  handler: async (req, res) => {
    if (req.get('X-Fail') === 'raise') throw new Error('boom');
    res.status(503).json({ error: 'unavailable' });
  },
}, async (t, app) => {
  const tenant = `store-${RUN}`;
  const first = await post(app.port, 'k-8', { amount: 1 }, { 'X-Tenant': tenant });
  assert.equal(first.status, 503);
  assertReplay(await post(app.port, 'k-8', { amount: 1 }, { 'X-Tenant': tenant }), first);
  const raised = await post(app.port, 'k-9', { amount: 1 }, { 'X-Tenant': tenant, 'X-Fail': 'raise' });
  assert.equal(raised.status, 500);
  assertReplay(await post(app.port, 'k-9', { amount: 1 }, { 'X-Tenant': tenant }), raised);
});

dbTest('a binary body and its headers (one of them repeated) replayed byte for byte', async (t, app) => {
  const body = Buffer.from(Array.from({ length: 512 }, (_, i) => (i * 37 + 11) % 256)); // every byte value
  const h = { 'Idempotency-Key': `bin-${RUN}`, 'Content-Type': 'application/x-test' };
  const first = await request(app.port, 'POST', '/echo', { body, headers: h });
  assert.equal(first.status, 200);
  assert.ok(first.bytes.equals(body));
  const again = await request(app.port, 'POST', '/echo', { body, headers: h });
  assertReplay(again, first);
  assert.deepEqual(again.raw.filter((_, i) => i % 2 === 0 && /^x-multi$/i.test(again.raw[i])).length, 2);
  const other = Buffer.from(body);
  other[100] ^= 1;
  assertProblem(await request(app.port, 'POST', '/echo', { body: other, headers: h }), 422, /reused/);
});

dbTest('two tenants (the scope hook) with the same key: two effects', async (t, app) => {
  const a = await post(app.port, `shared-${RUN}`, { amount: 4 }, { 'X-Tenant': `ta-${RUN}` });
  const b = await post(app.port, `shared-${RUN}`, { amount: 4 }, { 'X-Tenant': `tb-${RUN}` });
  assert.equal(a.status, 201);
  assert.equal(b.status, 201);
  assert.notEqual(a.json.id, b.json.id);
});

dbTestWith('two-phase: the claim commits before the handler (duplicates 409); a 503 releases the key, the retry reclaims at once; checkpoints', { mode: 'two_phase', leaseSeconds: 60 }, {
  handler: async (req, res) => {
    assert.equal(req.idempotency.client, undefined);
    if (req.get('X-Fail') === '503') return res.status(503).json({ error: 'unavailable' });
    const ends = await req.idempotency.checkpoint(`step-1/${req.idempotency.attempts}`);
    assert.ok(ends instanceof Date);
    res.status(201).json({ attempts: req.idempotency.attempts, status: req.idempotency.status, recovery: req.idempotency.recoveryPoint });
  },
}, async (t, app) => {
  const tenant = `2p-${RUN}`;
  const entered = gate();
  const release = gate();
  const first = postHeld(app, tenant, 'k-10', entered, release);
  await entered.promise;
  // Committed: another connection sees the key held.
  const { rows: [k] } = await db.admin.query(`SELECT count(*)::int AS n FROM idempotency.idempotency_keys
    WHERE key = 'k-10' AND scope = $1`, [tenant]);
  assert.equal(k.n, 1);
  assertProblem(await post(app.port, 'k-10', { amount: 3 }, { 'X-Tenant': tenant }), 409, /in progress/);
  release.open();
  assert.equal((await first).status, 201);
  const failed = await post(app.port, 'k-11', { amount: 3 }, { 'X-Tenant': tenant, 'X-Fail': '503' });
  assert.equal(failed.status, 503);
  const retry = await post(app.port, 'k-11', { amount: 3 }, { 'X-Tenant': tenant });
  assert.equal(retry.status, 201);
  assert.deepEqual(retry.json, { attempts: 2, status: 'reclaimed', recovery: null });
});

dbTestWith('a fingerprint override: only what it returns counts', { fingerprint: (req) => ({ amount: req.body.amount }) }, {}, async (t, app) => {
  const tenant = `fpo-${RUN}`;
  const first = await post(app.port, 'k-12', { amount: 2, note: 'a' }, { 'X-Tenant': tenant });
  assertReplay(await post(app.port, 'k-12', { amount: 2, note: 'b' }, { 'X-Tenant': tenant }), first);
  assertProblem(await post(app.port, 'k-12', { amount: 3, note: 'a' }, { 'X-Tenant': tenant }), 422, /reused/);
});

dbTest('SQLSTATEs: a scope over 255 bytes (22001) is 400, never 500', async (t, app) => {
  assertProblem(await post(app.port, 'k-13', { amount: 1 }, { 'X-Tenant': 's'.repeat(300) }), 400, /too long/);
});

test('SQLSTATEs: no USAGE on schema idempotency (42501) is 500, logged; an unreachable database is 503 with Retry-After', async (t) => {
  if (!db) return t.skip(SKIP);
  const nousage = new Pool({ user: 'node_test_nousage', max: 2 });
  const app = await startApp(nousage);
  try {
    const r = await post(app.port, 'k-14', { amount: 1 });
    assertProblem(r, 500, /Set-up error/);
    assert.equal(app.errors.length, 1);
    assert.equal(app.errors[0].code, '42501');
  } finally { await app.close(); await nousage.end(); }
  // A port nothing listens on (the test server's port + 1000 would be a guess: a closed socket dir).
  const gone = new Pool({ host: '/nonexistent-socket-dir', max: 1, connectionTimeoutMillis: 2000 });
  const app2 = await startApp(gone);
  try {
    const r = await post(app2.port, 'k-15', { amount: 1 });
    assertProblem(r, 503, /unavailable/);
    assert.equal(r.headers['retry-after'], '1');
  } finally { await app2.close(); await gone.end(); }
});

dbTest('the policy document', async (t, app) => {
  const r = await request(app.port, 'GET', '/policy');
  assert.equal(r.status, 200);
  assert.match(r.headers['content-type'], /^application\/json/);
  assert.deepEqual(r.json, { header: 'Idempotency-Key', required_for: ['POST', 'PATCH'], max_length: 255, ttl_seconds: 86400 });
});

test('policyHandler publishes the configured ttl and methods (no database)', async () => {
  const app = express();
  app.get('/p', policyHandler({ ttlSeconds: 3600, requiredFor: ['post'] }));
  const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
  try {
    const r = await request(server.address().port, 'GET', '/p');
    assert.deepEqual(r.json, { header: 'Idempotency-Key', required_for: ['POST'], max_length: 255, ttl_seconds: 3600 });
  } finally { server.close(); }
});

test('without a pool the factory refuses to start', () => {
  assert.throws(() => idempotency({}), /pool/);
  assert.throws(() => idempotency({ pool: {}, mode: 'twophase' }), /mode/);
});

/** A pool whose claims fail with SQLSTATE code `failures` times, then answer in_progress. */
function flakyPool(code, failures) {
  const seen = [];
  const client = {
    async query(text) {
      seen.push(text.trim().split(/\s+/)[0]);
      if (/claim_key/.test(text) && failures-- > 0) throw Object.assign(new Error(`simulated ${code}`), { code });
      return { rows: [{ status: 'in_progress', retry_after: 2 }] };
    },
    release() {},
    on() {},
    off() {},
  };
  return { seen, pool: { connect: async () => client, query: (t, p) => client.query(t, p) } };
}

test('40001 and 40P01 on the claim: retried in a new transaction up to 3 times, then 503 with Retry-After (no database)', async () => {
  for (const code of ['40001', '40P01']) {
    const twice = flakyPool(code, 2);
    let app = await startApp(twice.pool);
    try {
      const r = await post(app.port, 'k-r', { amount: 1 });
      assertProblem(r, 409, /in progress/);
      assert.equal(r.headers['retry-after'], '2');
      assert.deepEqual(twice.seen, ['BEGIN', 'SELECT', 'ROLLBACK', 'BEGIN', 'SELECT', 'ROLLBACK', 'BEGIN', 'SELECT', 'ROLLBACK']);
    } finally { await app.close(); }
    const always = flakyPool(code, 3);
    app = await startApp(always.pool);
    try {
      const r = await post(app.port, 'k-r', { amount: 1 });
      assertProblem(r, 503, /retry/);
      assert.equal(r.headers['retry-after'], '1');
    } finally { await app.close(); }
  }
  // Citus' transient error is retried, recognised by its message; another XX000 is not.
  const citus = flakyPool('XX000', 1);
  citus.pool.connect = ((orig) => async () => {
    const c = await orig();
    const q = c.query;
    c.query = async (text) => {
      try { return await q(text); } catch (e) { e.message = 'cannot execute a distributed query from a query on a shard'; throw e; }
    };
    return c;
  })(citus.pool.connect);
  let app = await startApp(citus.pool);
  try { assert.equal((await post(app.port, 'k-c', { amount: 1 })).status, 409); } finally { await app.close(); }
  const internal = flakyPool('XX000', 1);
  app = await startApp(internal.pool);
  try { assertProblem(await post(app.port, 'k-c', { amount: 1 }), 500, /Internal/); } finally { await app.close(); }
});
