// @ts-check
// Exactly-once message consumers over amqplib (RabbitMQ): the broker delivers at least once,
// the key makes the effect happen once. The key is the producer's Idempotency-Key header or
// the message id, never the delivery tag (a redelivery gets a new one).
//   single     BEGIN, claim_key, handler (in that transaction), complete_key, COMMIT, ack
//   batch      BEGIN, claim_keys over the batch, handlers (each in a savepoint), complete_keys,
//              one COMMIT, one multiple ack
//   two_phase  claim_key (committed), handler (outside effects; checkpoints), complete_key, ack;
//              release_key when the handler fails, so the retry reclaims at once
// claim answers: replay → ack (the effect is there); in_progress → requeue after retry_after
// (the message is held until then: no hot loop); mismatch → reject without requeue (the
// queue's dead-letter exchange gets it; a poison message never loops); a database error or a
// handler's error → nack with requeue after retryDelayMs. stop(): no new deliveries, the
// batch in hand finishes (or rolls back), held messages are requeued, then it returns.
'use strict';

const sql = require('./sql');

/** A handler's error that no retry will cure: the message is dead-lettered, not requeued. */
class PermanentError extends Error {
  /** @param {string} message */
  constructor(message) {
    super(message);
    this.name = 'PermanentError';
  }
}

/**
 * The message's idempotency key: its Idempotency-Key header, else its message id; undefined
 * when it has neither.
 * @param {import('amqplib').Message} msg
 * @returns {string | undefined}
 */
function messageKey(msg) {
  const headers = (msg.properties && msg.properties.headers) || {};
  for (const [name, value] of Object.entries(headers)) {
    if (name.toLowerCase() === 'idempotency-key' && value != null && String(value) !== '') return String(value);
  }
  const id = msg.properties && msg.properties.messageId;
  return id != null && String(id) !== '' ? String(id) : undefined;
}

/**
 * The fingerprint input of a message: its body as jsonb when it is JSON, else its bytes.
 * @param {Buffer} body
 * @returns {{ json: string | null, bytes: Buffer | null }}
 */
function bodyFingerprint(body) {
  const text = body.toString('utf8');
  try {
    JSON.parse(text);
    return { json: text, bytes: null };
  } catch {
    return { json: null, bytes: body };
  }
}

/**
 * @param {any} value a fingerprint override's answer: Buffer (bytes) or a JSON value
 * @returns {{ json: string | null, bytes: Buffer | null }}
 */
function overrideFingerprint(value) {
  return Buffer.isBuffer(value) ? { json: null, bytes: value } : { json: JSON.stringify(value ?? null), bytes: null };
}

const sleep = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Starts consuming. See index.d.ts for the options.
 * @param {import('../index').ConsumeOptions} options
 * @returns {Promise<import('../index').Consumer>}
 */
async function consume(options) {
  const o = {
    mode: 'single', prefetch: 50, scope: '', ttlSeconds: null, leaseSeconds: 30, retryDelayMs: 1000,
    batchLingerMs: 20, retries: 3, ...options,
  };
  const { channel, pool, queue, handler } = o;
  if (!channel || !pool || !queue || typeof handler !== 'function') {
    throw new TypeError('consume: channel, pool, queue and handler are required');
  }
  if (!['single', 'batch', 'two_phase'].includes(o.mode)) throw new TypeError('consume: mode is single, batch or two_phase');
  const log = o.onError || ((/** @type {any} */ err) => console.error('idempotency consumer:', err && err.message ? err.message : err));
  const event = o.onEvent || (() => {});
  const keyOf = o.key || messageKey;
  const fingerprintOf = (/** @type {import('amqplib').Message} */ msg) =>
    (o.fingerprint ? overrideFingerprint(o.fingerprint(msg)) : bodyFingerprint(msg.content));
  const ttl = sql.interval(o.ttlSeconds);
  const lease = sql.interval(o.leaseSeconds);

  let stopping = false;
  /** @type {Promise<void>} */
  let chain = Promise.resolve();
  /** Deliveries not yet acked or nacked, by tag (the multiple ack must not cover others). */
  const outstanding = new Map();
  /** Messages held back before their requeue (in_progress, errors), by tag. */
  const held = new Map();
  /** @type {import('amqplib').Message[]} */
  let buffer = [];
  /** @type {NodeJS.Timeout | undefined} */
  let linger;

  const settle = (/** @type {import('amqplib').Message} */ msg, /** @type {() => void} */ fn) => {
    outstanding.delete(msg.fields.deliveryTag);
    try { fn(); } catch (err) { log(err); } // the channel closed: the broker redelivers
  };
  const ack = (/** @type {import('amqplib').Message} */ msg) => settle(msg, () => channel.ack(msg));
  const reject = (/** @type {import('amqplib').Message} */ msg) => settle(msg, () => channel.reject(msg, false));
  const requeueNow = (/** @type {import('amqplib').Message} */ msg) => settle(msg, () => channel.nack(msg, false, true));
  /** Requeue after ms, holding the message meanwhile (it counts against the prefetch). */
  const requeueLater = (/** @type {import('amqplib').Message} */ msg, /** @type {number} */ ms) => {
    if (stopping) return requeueNow(msg);
    const tag = msg.fields.deliveryTag;
    const timer = setTimeout(() => { held.delete(tag); requeueNow(msg); }, ms);
    timer.unref(); // a held message alone keeps no process alive: the broker requeues it on close
    held.set(tag, { msg, timer });
  };
  /**
   * Acks msgs: one multiple ack up to the highest tag all of whose outstanding predecessors
   * are in msgs, single acks for the rest.
   * @param {import('amqplib').Message[]} msgs
   */
  const ackMany = (msgs) => {
    if (msgs.length === 0) return;
    const tags = new Set(msgs.map((m) => m.fields.deliveryTag));
    const sorted = [...outstanding.keys()].sort((a, b) => a - b);
    let upTo = -1;
    for (const tag of sorted) {
      if (!tags.has(tag)) break;
      upTo = tag;
    }
    const multiple = msgs.filter((m) => m.fields.deliveryTag <= upTo);
    if (multiple.length > 0) {
      const last = multiple.reduce((a, b) => (a.fields.deliveryTag > b.fields.deliveryTag ? a : b));
      for (const m of multiple) outstanding.delete(m.fields.deliveryTag);
      try { channel.ack(last, true); } catch (err) { log(err); }
    }
    for (const m of msgs) if (m.fields.deliveryTag > upTo) ack(m);
  };

  const retryAfterMs = (/** @type {any} */ claim) => Math.max(1, Number(claim.retry_after) || 1) * 1000;

  /**
   * @param {import('pg').PoolClient} client
   * @param {string} key @param {string} token @param {string} scope
   * @param {boolean} inTransaction
   */
  const context = (client, key, token, scope, inTransaction) => ({
    /** @param {string} point @param {number} [leaseSeconds] */
    checkpoint: async (point, leaseSeconds) => {
      const q = [key, token, point, scope, sql.interval(leaseSeconds ?? (inTransaction ? null : o.leaseSeconds))];
      return (await (inTransaction ? client : pool).query(sql.CHECKPOINT_SQL, q)).rows[0].lease_ends;
    },
  });

  /** What an error means for the message: dead-letter or requeue later. */
  const failed = (/** @type {import('amqplib').Message} */ msg, /** @type {any} */ err, /** @type {string} */ key) => {
    if (err instanceof PermanentError || (err && err.permanent === true)) {
      event({ type: 'dead_letter', key, message: msg, error: err });
      return reject(msg);
    }
    log(err);
    event({ type: 'retry', key, message: msg, error: err });
    return requeueLater(msg, o.retryDelayMs);
  };

  /** One message, one transaction (single) or claim / call / complete (two_phase). */
  async function processOne(/** @type {import('amqplib').Message} */ msg) {
    if (stopping) return requeueNow(msg); // received, not started: back to the queue
    const key = keyOf(msg);
    if (key === undefined) {
      log(new Error('a message without message id or Idempotency-Key header: dead-lettered'));
      event({ type: 'dead_letter', key, message: msg });
      return reject(msg);
    }
    const fp = fingerprintOf(msg);
    const scope = o.scope;
    const params = [key, fp.json ?? fp.bytes, scope, ttl, o.mode === 'two_phase' ? lease : null, '0 seconds'];
    const claimText = sql.claimSql(fp.json !== null ? 'json' : 'bytes');
    /** @type {import('pg').PoolClient | undefined} */
    let client;
    let broken = false;
    const onLost = () => { broken = true; }; // the session lost while held: see lib/express.js
    let inTx = false;
    try {
      client = await pool.connect();
      client.on('error', onLost);
      const c = client;
      const claim = await sql.withRetry(async () => {
        if (o.mode === 'two_phase') return (await c.query(claimText, params)).rows[0];
        await c.query('BEGIN');
        inTx = true;
        try {
          return (await c.query(claimText, params)).rows[0];
        } catch (err) {
          await c.query('ROLLBACK');
          inTx = false;
          throw err;
        }
      }, o.retries);
      if (claim.status === 'replay' || claim.status === 'in_progress' || claim.status === 'mismatch') {
        if (inTx) { await c.query('ROLLBACK'); inTx = false; }
        event({ type: claim.status, key, message: msg });
        if (claim.status === 'replay') return ack(msg);
        if (claim.status === 'mismatch') return reject(msg);
        return requeueLater(msg, retryAfterMs(claim));
      }
      const info = { key, scope, token: claim.token, status: claim.status, recoveryPoint: claim.recovery_point,
        attempts: claim.attempts };
      if (o.mode === 'two_phase') {
        client.off('error', onLost);
        client.release();
        client = undefined;
        let result;
        try {
          result = await handler(msg, { ...info, ...context(c, key, claim.token, scope, false) });
        } catch (err) {
          // A transient failure gives the key up: the redelivery reclaims it at once.
          await sql.withRetry(() => pool.query(sql.RELEASE_SQL, [key, claim.token, scope]), o.retries)
            .catch((e) => log(e));
          return failed(msg, err, key);
        }
        await sql.withRetry(() => pool.query(sql.COMPLETE_SQL,
          [key, claim.token, JSON.stringify(result ?? null), null, scope, null, null]), o.retries);
      } else {
        let result;
        try {
          result = await handler(msg, { ...info, client: c, ...context(c, key, claim.token, scope, true) });
        } catch (err) {
          await c.query('ROLLBACK');
          inTx = false;
          return failed(msg, err, key);
        }
        await c.query(sql.COMPLETE_SQL, [key, claim.token, JSON.stringify(result ?? null), null, scope, null, null]);
        await c.query('COMMIT');
        inTx = false;
      }
      event({ type: 'applied', key, message: msg, status: claim.status });
      if (o.afterCommit) await o.afterCommit({ key, messages: [msg] });
      return ack(msg);
    } catch (err) {
      if (client && inTx) await client.query('ROLLBACK').catch(() => { broken = true; });
      if (sql.isUnavailable(err)) broken = true;
      log(err);
      event({ type: 'db_error', key, message: msg, error: err });
      return requeueLater(msg, o.retryDelayMs);
    } finally {
      if (client) { client.off('error', onLost); client.release(broken ? true : undefined); }
    }
  }

  /** A batch in one transaction. */
  async function processBatch(/** @type {import('amqplib').Message[]} */ batch) {
    /** @type {import('amqplib').Message[]} */
    const items = [];
    for (const msg of batch) {
      if (keyOf(msg) === undefined) {
        log(new Error('a message without message id or Idempotency-Key header: dead-lettered'));
        reject(msg);
      } else items.push(msg);
    }
    if (items.length === 0) return;
    const keys = items.map((m) => /** @type {string} */ (keyOf(m)));
    const fps = items.map(fingerprintOf);
    const scope = o.scope;
    /** @type {import('pg').PoolClient | undefined} */
    let client;
    let broken = false;
    const onLost = () => { broken = true; }; // the session lost while held: see lib/express.js
    let inTx = false;
    try {
      client = await pool.connect();
      client.on('error', onLost);
      const c = client;
      const rows = await sql.withRetry(async () => {
        await c.query('BEGIN');
        inTx = true;
        try {
          return (await c.query(sql.CLAIM_KEYS_SQL, [keys, fps.map((f) => f.json), fps.map((f) => f.bytes), scope, ttl, null])).rows;
        } catch (err) {
          await c.query('ROLLBACK');
          inTx = false;
          throw err;
        }
      }, o.retries);
      /** @type {import('amqplib').Message[]} */ const toAck = [];
      /** @type {import('amqplib').Message[]} */ const toReject = [];
      /** @type {{ msg: import('amqplib').Message, ms: number }[]} */ const toRequeue = [];
      /** @type {string[]} */ const doneKeys = [];
      /** @type {string[]} */ const doneTokens = [];
      /** @type {string[]} */ const doneResponses = [];
      /** first occurrence's outcome of each key: 'ack' | 'requeue' */
      const firstOutcome = new Map();
      /** @type {[number, import('amqplib').Message][]} */
      const repeats = [];
      for (let i = 0; i < rows.length; i++) {
        const row = rows[i];
        const msg = items[i];
        const key = keys[i];
        if (row.key !== key) throw new Error('claim_keys answered out of order');
        const first = !firstOutcome.has(key);
        switch (row.status) {
          case 'claimed':
          case 'reclaimed': {
            await c.query('SAVEPOINT idempotency_message');
            try {
              const result = await handler(msg, { key, scope, token: row.token, status: row.status,
                recoveryPoint: row.recovery_point, attempts: row.attempts, client: c,
                ...context(c, key, row.token, scope, true) });
              await c.query('RELEASE SAVEPOINT idempotency_message');
              doneKeys.push(key);
              doneTokens.push(row.token);
              doneResponses.push(JSON.stringify(result ?? null));
              toAck.push(msg);
              firstOutcome.set(key, 'ack');
              event({ type: 'applied', key, message: msg, status: row.status });
            } catch (err) {
              // Only this message's writes go; its claim is given up so that its redelivery
              // reclaims at once (a committed, uncompleted claim would hold it for a lease).
              await c.query('ROLLBACK TO SAVEPOINT idempotency_message');
              await c.query(sql.RELEASE_SQL, [key, row.token, scope]);
              firstOutcome.set(key, 'requeue');
              if (err instanceof PermanentError || (/** @type {any} */ (err)).permanent === true) {
                toReject.push(msg);
                event({ type: 'dead_letter', key, message: msg, error: err });
              } else {
                log(err);
                toRequeue.push({ msg, ms: o.retryDelayMs });
                event({ type: 'retry', key, message: msg, error: err });
              }
            }
            break;
          }
          case 'replay':
            toAck.push(msg);
            if (first) firstOutcome.set(key, 'ack');
            event({ type: 'replay', key, message: msg });
            break;
          case 'mismatch':
            toReject.push(msg);
            if (first) firstOutcome.set(key, 'ack');
            event({ type: 'mismatch', key, message: msg });
            break;
          case 'in_progress':
            if (first) {
              firstOutcome.set(key, 'requeue');
              toRequeue.push({ msg, ms: retryAfterMs(row) });
              event({ type: 'in_progress', key, message: msg });
            } else {
              repeats.push([i, msg]); // a repeat within this batch: follows its first copy
            }
            break;
          default:
            throw new Error(`unexpected claim status ${row.status}`);
        }
      }
      for (const [i, msg] of repeats) {
        if (firstOutcome.get(keys[i]) === 'ack') {
          toAck.push(msg);
          event({ type: 'replay', key: keys[i], message: msg });
        } else toRequeue.push({ msg, ms: o.retryDelayMs });
      }
      if (doneKeys.length > 0) await c.query(sql.COMPLETE_KEYS_SQL, [doneKeys, doneTokens, doneResponses, scope]);
      await c.query('COMMIT');
      inTx = false;
      if (o.afterCommit) await o.afterCommit({ key: undefined, messages: items });
      for (const m of toReject) reject(m);
      for (const { msg, ms } of toRequeue) requeueLater(msg, ms);
      ackMany(toAck);
    } catch (err) {
      if (client && inTx) await client.query('ROLLBACK').catch(() => { broken = true; });
      if (sql.isUnavailable(err)) broken = true;
      log(err);
      for (const msg of items) {
        event({ type: 'db_error', key: keyOf(msg), message: msg, error: err });
        requeueLater(msg, o.retryDelayMs);
      }
    } finally {
      if (client) { client.off('error', onLost); client.release(broken ? true : undefined); }
    }
  }

  const enqueue = (/** @type {() => Promise<void>} */ work) => {
    chain = chain.then(work).catch((err) => log(err));
  };
  const flush = () => {
    if (linger) { clearTimeout(linger); linger = undefined; }
    if (buffer.length === 0) return;
    const batch = buffer;
    buffer = [];
    enqueue(() => processBatch(batch));
  };

  await channel.prefetch(o.prefetch);
  const { consumerTag } = await channel.consume(queue, (msg) => {
    if (msg === null) return; // cancelled by the broker
    outstanding.set(msg.fields.deliveryTag, msg);
    if (stopping) return requeueNow(msg);
    if (o.mode === 'batch') {
      buffer.push(msg);
      if (buffer.length >= o.prefetch) flush();
      else if (!linger) linger = setTimeout(flush, o.batchLingerMs);
    } else {
      enqueue(() => processOne(msg));
    }
  }, { noAck: false });

  /** @type {Promise<void> | undefined} */
  let stopped;
  return {
    consumerTag,
    stop() {
      if (stopped) return stopped;
      stopping = true;
      stopped = (async () => {
        await channel.cancel(consumerTag).catch((err) => log(err));
        if (linger) { clearTimeout(linger); linger = undefined; }
        // Received, not started: back to the queue now.
        for (const msg of buffer) requeueNow(msg);
        buffer = [];
        await chain; // the message or batch in hand finishes (or rolls back)
        for (const { msg, timer } of held.values()) { clearTimeout(timer); requeueNow(msg); }
        held.clear();
      })();
      return stopped;
    },
  };
}

module.exports = { consume, messageKey, bodyFingerprint, PermanentError, sleep };
