// Sends real HTTP requests to server.js (started here as a child process, with --setup) and
// checks the Idempotency-Key semantics end to end. Needs the PG* environment of a database
// (the server's role), SETUP_DATABASE_URL when that role may not create the tables (another
// role's connection, which grants them), and HTTP_PORT (default 3000) free.
//   node --test test/http.test.js
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const path = require('node:path');
const { spawn } = require('node:child_process');

const PORT = Number(process.env.HTTP_PORT || 3000);
const DELAY_MS = 400; // the server holds each effect's transaction open this long
const run = Date.now().toString(36); // accounts unique to this run

function request(method, urlPath, { body, headers = {} } = {}) {
  return new Promise((resolve, reject) => {
    const data = body === undefined ? undefined : Buffer.from(body);
    const req = http.request({
      host: '127.0.0.1', port: PORT, method, path: urlPath, agent: false,
      headers: { ...(data ? { 'Content-Type': 'application/json', 'Content-Length': data.length } : {}), ...headers },
    }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const bytes = Buffer.concat(chunks);
        const text = bytes.toString('utf8');
        resolve({ status: res.statusCode, headers: res.headers, bytes, text, json: text ? JSON.parse(text) : undefined });
      });
    });
    req.on('error', reject);
    if (data) req.write(data);
    req.end();
  });
}

const post = (key, body) =>
  request('POST', '/payments', { body, headers: key === undefined ? {} : { 'Idempotency-Key': key } });
const account = async (id) => (await request('GET', `/accounts/${encodeURIComponent(id)}`)).json;

let server;
test.before(async () => {
  server = spawn(process.execPath, [path.join(__dirname, '..', 'server.js'), '--setup'], {
    env: { ...process.env, PORT: String(PORT), EXAMPLE_EFFECT_DELAY_MS: String(DELAY_MS) },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start in 20 s')), 20000);
    server.stdout.on('data', (d) => {
      if (String(d).includes('listening')) { clearTimeout(timer); resolve(); }
    });
    server.on('exit', (code) => reject(new Error(`server exited with ${code}`)));
  });
});
test.after(() => { if (server) server.kill('SIGTERM'); });

test('a POST without Idempotency-Key is refused with 400 and has no effect', async () => {
  const acct = `nokey-${run}`;
  const r = await post(undefined, JSON.stringify({ account: acct, amount: 5 }));
  assert.equal(r.status, 400);
  assert.match(r.json.title, /Idempotency-Key/);
  assert.equal((await request('GET', `/accounts/${acct}`)).status, 404);
});

// The replay is the first response as sent: the same status, the same bytes, the same headers
// (Content-Type, Location, Content-Length), plus Idempotent-Replayed.
function assertReplayOf(replay, first) {
  assert.equal(replay.status, first.status);
  assert.equal(replay.headers['idempotent-replayed'], 'true');
  assert.ok(replay.bytes.equals(first.bytes), `body ${replay.text} is not ${first.text}`);
  for (const h of ['content-type', 'location', 'content-length']) assert.equal(replay.headers[h], first.headers[h], h);
}

test('a retry gets the stored status, headers and body byte for byte, marked as replayed, and no second effect', async () => {
  const acct = `replay-${run}`;
  const first = await post(`k1-${run}`, JSON.stringify({ account: acct, amount: 100 }));
  assert.equal(first.status, 201);
  assert.equal(first.headers['idempotent-replayed'], undefined);
  assert.equal(first.json.balance, 100);
  assert.match(first.headers.location, /^\/payments\/[0-9]+$/);
  assert.equal(first.headers['content-type'], 'application/json');
  // The handler's key order, which a jsonb response would not keep ("account" < "payment").
  assert.match(first.text, /^\{"payment":[0-9]+,"account":/);
  // Same payload, other key order and spacing: the jsonb fingerprint is the same.
  const again = await post(`k1-${run}`, `{ "amount": 100,   "account": "${acct}" }`);
  assertReplayOf(again, first);
  assert.equal(again.text, first.text);
  assert.deepEqual(await account(acct), { account: acct, balance: 100, payments: 1 });
});

test('the same key with another payload gets 422 and no effect', async () => {
  const acct = `mismatch-${run}`;
  assert.equal((await post(`k2-${run}`, JSON.stringify({ account: acct, amount: 10 }))).status, 201);
  const other = await post(`k2-${run}`, JSON.stringify({ account: acct, amount: 9999 }));
  assert.equal(other.status, 422);
  assert.equal(other.headers['idempotent-replayed'], undefined);
  assert.deepEqual(await account(acct), { account: acct, balance: 10, payments: 1 });
});

test('a duplicate sent while the first is in flight gets 409 with Retry-After, then the replay', async () => {
  const acct = `inflight-${run}`;
  const body = JSON.stringify({ account: acct, amount: 7 });
  const first = post(`k3-${run}`, body);
  await new Promise((r) => setTimeout(r, DELAY_MS / 4)); // the first is inside its transaction
  const dup = await post(`k3-${run}`, body);
  assert.equal(dup.status, 409);
  assert.ok(Number(dup.headers['retry-after']) >= 1, `Retry-After: ${dup.headers['retry-after']}`);
  const done = await first;
  assert.equal(done.status, 201);
  const later = await post(`k3-${run}`, body);
  assertReplayOf(later, done);
  assert.deepEqual(await account(acct), { account: acct, balance: 7, payments: 1 });
});

test('of 12 concurrent duplicates exactly one executes the effect', async () => {
  const acct = `race-${run}`;
  const body = JSON.stringify({ account: acct, amount: 42 });
  const results = await Promise.all(Array.from({ length: 12 }, () => post(`k4-${run}`, body)));
  const executed = results.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === undefined);
  const replayed = results.filter((r) => r.status === 201 && r.headers['idempotent-replayed'] === 'true');
  const inFlight = results.filter((r) => r.status === 409);
  assert.equal(executed.length, 1, JSON.stringify(results.map((r) => r.status)));
  assert.equal(executed.length + replayed.length + inFlight.length, results.length);
  assert.ok(inFlight.length >= 1, 'some duplicates arrived while the first was in flight');
  for (const r of inFlight) assert.ok(Number(r.headers['retry-after']) >= 1);
  for (const r of replayed) assertReplayOf(r, executed[0]);
  assert.deepEqual(await account(acct), { account: acct, balance: 42, payments: 1 });
});

test('keys are independent: two keys, two effects', async () => {
  const acct = `twokeys-${run}`;
  const body = JSON.stringify({ account: acct, amount: 1 });
  const [a, b] = await Promise.all([post(`k5a-${run}`, body), post(`k5b-${run}`, body)]);
  assert.equal(a.status, 201);
  assert.equal(b.status, 201);
  assert.deepEqual(await account(acct), { account: acct, balance: 2, payments: 2 });
});

test('a key longer than 255 bytes is refused with 400', async () => {
  const r = await post('x'.repeat(256), JSON.stringify({ account: `long-${run}`, amount: 1 }));
  assert.equal(r.status, 400);
});
