// The consumer helpers against a real PostgreSQL (the PG* environment; skipped without one)
// and an in-memory channel with amqplib's interface, which records every ack, nack and reject
// (the broker suite runs them on a real RabbitMQ). node --test test/consumer.test.js
'use strict';

const test = require('node:test');
const assert = require('node:assert/strict');
const { Pool } = require('pg');
const { consume, messageKey, PermanentError } = require('..');
const { database, closeDatabase, SKIP, RUN } = require('./db');

/** amqplib's Channel, as far as consume uses it; deliveries are made by the test. */
class FakeChannel {
  constructor() {
    this.tag = 0;
    this.settles = []; // [op, tag, multiple, requeue]
    this.waiters = [];
    this.cancelled = false;
  }
  async prefetch(n) { this.prefetchCount = n; }
  async consume(queue, cb) { this.queue = queue; this.cb = cb; return { consumerTag: 'ctag-1' }; }
  async cancel(tag) { assert.equal(tag, 'ctag-1'); this.cancelled = true; }
  record(op, msg, multiple, requeue) {
    this.settles.push([op, msg.fields.deliveryTag, multiple, requeue]);
    for (const w of this.waiters.slice()) if (w.check()) { this.waiters.splice(this.waiters.indexOf(w), 1); w.resolve(); }
  }
  ack(msg, allUpTo = false) { this.record('ack', msg, allUpTo, undefined); }
  nack(msg, allUpTo = false, requeue = true) { this.record('nack', msg, allUpTo, requeue); }
  reject(msg, requeue = true) { this.record('reject', msg, false, requeue); }
  /** Delivers a message; returns it. */
  deliver(body, properties = {}) {
    const msg = { content: Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body)),
      fields: { deliveryTag: ++this.tag, redelivered: false }, properties: { headers: {}, ...properties } };
    this.cb(msg);
    return msg;
  }
  /** How msg was settled: 'ack', 'nack-requeue', 'reject' (dead-letter), or undefined. */
  outcome(msg) {
    const t = msg.fields.deliveryTag;
    const s = this.settles.find(([, tag, multiple]) => tag === t || (multiple && tag > t));
    if (!s) return undefined;
    if (s[0] === 'ack') return 'ack';
    return s[3] ? 'nack-requeue' : 'reject';
  }
  /** Resolves once every message of msgs is settled. */
  settled(...msgs) {
    return new Promise((resolve) => {
      const w = { check: () => msgs.every((m) => this.outcome(m) !== undefined), resolve };
      if (w.check()) resolve(); else this.waiters.push(w);
    });
  }
}

let db;
test.before(async () => { db = await database(); if (!db) console.log(`# ${SKIP}`); });
test.after(closeDatabase);

const effects = async (prefix) => (await db.admin.query(
  'SELECT message_id, count(*)::int AS n FROM node_test_effects WHERE message_id LIKE $1 GROUP BY 1 ORDER BY 1', [`${prefix}%`])).rows;

/** The effect: one row per application, in the claim's transaction (ctx.client) or autocommit. */
const effect = (pool) => async (msg, ctx) => {
  const body = JSON.parse(msg.content.toString());
  if (body.fail === 'permanent') throw new PermanentError('poison');
  if (body.fail === 'transient' && ctx.attempts === 1) {
    await (ctx.client || pool).query("INSERT INTO node_test_effects VALUES ($1::text, 'rolled back', 0)", [ctx.key]);
    throw new Error('transient');
  }
  await (ctx.client || pool).query('INSERT INTO node_test_effects VALUES ($1::text, $2::text, $3::int)', [ctx.key, 'test', body.amount]);
  return { applied: body.amount };
};

// A broken consumer may never settle a message: the timeout makes that a failure, not a hang.
function dbTest(name, fn) {
  test(name, { timeout: 60000 }, async (t) => {
    if (!db) return t.skip(SKIP);
    await fn(t);
  });
}

test('the key: the Idempotency-Key header (any case) first, then the message id, never the delivery tag', () => {
  const m = (headers, messageId) => ({ properties: { headers, messageId }, fields: { deliveryTag: 7 } });
  assert.equal(messageKey(m({ 'Idempotency-Key': 'h-1' }, 'id-1')), 'h-1');
  assert.equal(messageKey(m({ 'idempotency-key': 'h-2' }, 'id-1')), 'h-2');
  assert.equal(messageKey(m({}, 'id-1')), 'id-1');
  assert.equal(messageKey(m({}, undefined)), undefined);
  assert.equal(messageKey(m(undefined, '')), undefined);
});

dbTest('single: each key applied once in the claim\'s transaction, then acked; duplicates acked as replays; mismatch dead-lettered; no key dead-lettered', async () => {
  const ch = new FakeChannel();
  const p = `s-${RUN}-`;
  const events = [];
  const c = await consume({ channel: ch, pool: db.app, queue: 'q', mode: 'single', prefetch: 7, handler: effect(db.app),
    onEvent: (e) => events.push(e.type) });
  assert.equal(ch.prefetchCount, 7);
  const a = ch.deliver({ amount: 5 }, { messageId: `${p}1` });
  const dup = ch.deliver('{"amount":5}', { messageId: `${p}1` }); // the same JSON, other spacing
  const other = ch.deliver({ amount: 6 }, { messageId: `${p}1` });
  const b = ch.deliver({ amount: 7 }, { messageId: 'ignored', headers: { 'Idempotency-Key': `${p}2` } });
  const nokey = ch.deliver({ amount: 8 });
  await ch.settled(a, dup, other, b, nokey);
  assert.deepEqual([a, dup, other, b, nokey].map((m) => ch.outcome(m)), ['ack', 'ack', 'reject', 'ack', 'reject']);
  assert.deepEqual(await effects(p), [{ message_id: `${p}1`, n: 1 }, { message_id: `${p}2`, n: 1 }]);
  assert.deepEqual(events, ['applied', 'replay', 'mismatch', 'applied', 'dead_letter']);
  await c.stop();
  assert.ok(ch.cancelled);
});

dbTest('single: a handler error rolls its writes back with the claim and requeues after retryDelayMs; the redelivery applies it once; a PermanentError is dead-lettered', async () => {
  const ch = new FakeChannel();
  const p = `se-${RUN}-`;
  const c = await consume({ channel: ch, pool: db.app, queue: 'q', handler: effect(db.app), retryDelayMs: 50, onError: () => {} });
  const m = ch.deliver({ amount: 1, fail: 'transient' }, { messageId: `${p}1` });
  const poison = ch.deliver({ amount: 1, fail: 'permanent' }, { messageId: `${p}2` });
  await ch.settled(m, poison);
  assert.equal(ch.outcome(m), 'nack-requeue');
  assert.equal(ch.outcome(poison), 'reject');
  assert.deepEqual(await effects(p), []); // the failed attempt's row went with the rollback
  // The broker redelivers: the rolled-back claim left nothing, so this is claimed afresh (attempts 1 again).
  const again = ch.deliver({ amount: 1 }, { messageId: `${p}1` });
  await ch.settled(again);
  assert.equal(ch.outcome(again), 'ack');
  assert.deepEqual(await effects(p), [{ message_id: `${p}1`, n: 1 }]);
  await c.stop();
});

dbTest('in_progress: the message is held until retry_after, then requeued (no hot loop); the redelivery after the holder commits is a replay', async () => {
  const ch = new FakeChannel();
  const key = `ip-${RUN}`;
  const holder = await db.app.connect();
  try {
    await holder.query('BEGIN');
    const { rows: [claim] } = await holder.query(
      "SELECT token::text FROM idempotency.claim_key($1::text, idempotency.request_fingerprint($2::jsonb), ''::text)",
      [key, '{"amount": 3}']);
    const events = [];
    const c = await consume({ channel: ch, pool: db.app, queue: 'q', handler: effect(db.app), onEvent: (e) => events.push([e.type, Date.now()]) });
    const m = ch.deliver({ amount: 3 }, { messageId: key });
    await ch.settled(m);
    assert.equal(ch.outcome(m), 'nack-requeue');
    const [type, at] = events[0];
    assert.equal(type, 'in_progress');
    const nackedAfter = Date.now() - at;
    assert.ok(nackedAfter >= 900, `requeued ${nackedAfter} ms after in_progress: retry_after (1 s while the holder is open) was not waited`);
    await holder.query("SELECT idempotency.complete_key($1::text, $2::uuid, '{}'::jsonb)", [key, claim.token]);
    await holder.query('COMMIT');
    const again = ch.deliver({ amount: 3 }, { messageId: key });
    await ch.settled(again);
    assert.equal(ch.outcome(again), 'ack');
    assert.equal(events[1][0], 'replay');
    assert.deepEqual(await effects(key), []); // the holder's effect, not ours
    await c.stop();
  } finally {
    await holder.query('ROLLBACK').catch(() => {});
    holder.release();
  }
});

dbTest('batch: claim_keys over the batch, one COMMIT, one multiple ack; a repeat in the batch is acked, a mismatch dead-lettered, a failing handler rolls back alone and is requeued', async () => {
  const ch = new FakeChannel();
  const p = `b-${RUN}-`;
  const statements = [];
  // Count the transactions: every COMMIT of the consumer's connections.
  const pool = new Pool({ user: 'node_test_app', max: 2 });
  pool.on('connect', (client) => {
    const q = client.query.bind(client);
    client.query = (...args) => { if (typeof args[0] === 'string') statements.push(args[0].trim().split(/\s+/)[0]); return q(...args); };
  });
  try {
    const c = await consume({ channel: ch, pool, queue: 'q', mode: 'batch', prefetch: 6, handler: effect(pool),
      retryDelayMs: 50, onError: () => {} });
    const msgs = [
      ch.deliver({ amount: 1 }, { messageId: `${p}1` }),
      ch.deliver({ amount: 2 }, { messageId: `${p}2` }),
      ch.deliver({ amount: 1 }, { messageId: `${p}1` }), // a repeat in the batch
      ch.deliver({ amount: 9 }, { messageId: `${p}2` }), // another body under the key
      ch.deliver({ amount: 4, fail: 'transient' }, { messageId: `${p}3` }),
      ch.deliver({ amount: 5 }, { messageId: `${p}4` }),
    ];
    await ch.settled(...msgs);
    assert.deepEqual(msgs.map((m) => ch.outcome(m)), ['ack', 'ack', 'ack', 'reject', 'nack-requeue', 'ack']);
    assert.equal(statements.filter((s) => s === 'COMMIT').length, 1);
    const acks = ch.settles.filter(([op]) => op === 'ack');
    // Tags 1-3 in one multiple ack; 4 is rejected, 5 still held for its requeue: 6 alone.
    assert.deepEqual(acks, [['ack', 3, true, undefined], ['ack', 6, false, undefined]]);
    assert.deepEqual(await effects(p), [{ message_id: `${p}1`, n: 1 }, { message_id: `${p}2`, n: 1 }, { message_id: `${p}4`, n: 1 }]);
    // The failed message's claim was released in the batch: its redelivery is reclaimed at once.
    const again = ch.deliver({ amount: 4, fail: 'transient' }, { messageId: `${p}3` });
    await ch.settled(again);
    assert.equal(ch.outcome(again), 'ack');
    assert.deepEqual((await effects(`${p}3`)), [{ message_id: `${p}3`, n: 1 }]);
    await c.stop();
  } finally {
    await pool.end();
  }
});

dbTest('batch: a full clean batch is one multiple ack of its last tag', async () => {
  const ch = new FakeChannel();
  const p = `bm-${RUN}-`;
  const c = await consume({ channel: ch, pool: db.app, queue: 'q', mode: 'batch', prefetch: 5, handler: effect(db.app) });
  const msgs = [1, 2, 3, 4, 5].map((i) => ch.deliver({ amount: i }, { messageId: `${p}${i}` }));
  await ch.settled(...msgs);
  assert.deepEqual(ch.settles, [['ack', 5, true, undefined]]);
  await c.stop();
});

dbTest('two_phase: the claim is committed before the handler runs; a failure releases the key (the redelivery is reclaimed at once, attempts 2); checkpoints are kept', async () => {
  const ch = new FakeChannel();
  const p = `tp-${RUN}-`;
  const seen = [];
  const c = await consume({ channel: ch, pool: db.app, queue: 'q', mode: 'two_phase', leaseSeconds: 60, retryDelayMs: 50, onError: () => {},
    handler: async (msg, ctx) => {
      assert.equal(ctx.client, undefined);
      const { rows: [k] } = await db.admin.query('SELECT count(*)::int AS n FROM idempotency.idempotency_keys WHERE key = $1', [ctx.key]);
      seen.push([ctx.status, ctx.attempts, k.n, ctx.recoveryPoint]);
      await ctx.checkpoint(`attempt-${ctx.attempts}`);
      return effect(db.app)(msg, ctx);
    } });
  const m = ch.deliver({ amount: 2, fail: 'transient' }, { messageId: `${p}1` });
  await ch.settled(m);
  assert.equal(ch.outcome(m), 'nack-requeue');
  const again = ch.deliver({ amount: 2, fail: 'transient' }, { messageId: `${p}1` });
  await ch.settled(again);
  assert.equal(ch.outcome(again), 'ack');
  // Visible to another connection during the handler: committed. Released, then reclaimed with the checkpoint.
  assert.deepEqual(seen, [['claimed', 1, 1, null], ['reclaimed', 2, 1, 'attempt-1']]);
  // The transient attempt's effect is outside the database's transaction (two-phase): it stays.
  assert.deepEqual(await effects(p), [{ message_id: `${p}1`, n: 2 }]);
  const dup = ch.deliver({ amount: 2, fail: 'transient' }, { messageId: `${p}1` });
  await ch.settled(dup);
  assert.equal(ch.outcome(dup), 'ack');
  await c.stop();
});

dbTest('a database error: nack with requeue after retryDelayMs, never an ack', async () => {
  const ch = new FakeChannel();
  const gone = new Pool({ host: '/nonexistent-socket-dir', max: 1 });
  const errors = [];
  const c = await consume({ channel: ch, pool: gone, queue: 'q', handler: () => assert.fail('ran'), retryDelayMs: 10, onError: (e) => errors.push(e) });
  const m = ch.deliver({ amount: 1 }, { messageId: `db-${RUN}` });
  await ch.settled(m);
  assert.equal(ch.outcome(m), 'nack-requeue');
  assert.equal(errors.length, 1);
  await c.stop();
  await gone.end();
});

dbTest('stop(): cancels the consumer, lets the message in hand finish, requeues held and unstarted ones at once', async () => {
  const ch = new FakeChannel();
  const p = `st-${RUN}-`;
  let release;
  const inHandler = new Promise((r) => { release = r; });
  let entered;
  const enteredP = new Promise((r) => { entered = r; });
  const c = await consume({ channel: ch, pool: db.app, queue: 'q', retryDelayMs: 60000, onError: () => {},
    handler: async (msg, ctx) => {
      if (ctx.key === `${p}slow`) { entered(); await inHandler; }
      return effect(db.app)(msg, ctx);
    } });
  const heldMsg = ch.deliver({ amount: 1, fail: 'transient' }, { messageId: `${p}held` }); // held for 60 s
  await new Promise((r) => setImmediate(r));
  const slow = ch.deliver({ amount: 2 }, { messageId: `${p}slow` });
  const queued = ch.deliver({ amount: 3 }, { messageId: `${p}queued` });
  await enteredP;
  const stopping = c.stop();
  release();
  await stopping;
  assert.ok(ch.cancelled);
  assert.equal(ch.outcome(slow), 'ack');
  assert.equal(ch.outcome(queued), 'nack-requeue');
  assert.equal(ch.outcome(heldMsg), 'nack-requeue');
  assert.deepEqual(await effects(p), [{ message_id: `${p}slow`, n: 1 }]);
  const late = ch.deliver({ amount: 4 }, { messageId: `${p}late` });
  assert.equal(ch.outcome(late), 'nack-requeue');
});
