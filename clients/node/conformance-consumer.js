// The conformance consumer (clients/conformance/CONTRACT.md, "The broker consumer"), written
// with this package: AMQP_URL, DATABASE_URL, QUEUE, CONSUMER_MODE (single, batch, two_phase),
// PREFETCH (50), CONSUMER_ID, CRASH_AFTER_COMMIT (N: SIGKILL itself after the Nth COMMIT,
// before the ack). The effect: INSERT INTO broker_effects (message_id, consumer, amount), in
// the claim's transaction (single, batch) or on its own connection after the claim's COMMIT
// (two_phase, checkpointed so that a reclaim after a crash does not repeat it).
//   node clients/node/conformance-consumer.js
'use strict';

const fs = require('fs');
const amqp = require('amqplib');
const { Pool } = require('pg');
const { consume, PermanentError } = require('.');
const { clientConfig } = require('./lib/dsn');

const env = process.env;
const mode = env.CONSUMER_MODE || 'single';
const consumerId = env.CONSUMER_ID || `node-${process.pid}`;
const crashAfter = Number(env.CRASH_AFTER_COMMIT || 0);
const prefetch = Number(env.PREFETCH || 50);

async function main() {
  const pool = new Pool({ ...clientConfig(env.DATABASE_URL || ''), max: 4 });
  pool.on('error', (err) => console.error(`[${consumerId}] idle connection lost: ${err.message}`));
  const conn = await amqp.connect(env.AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672/');
  const channel = await conn.createChannel();
  let commits = 0;
  const counts = { applied: 0, replay: 0, in_progress: 0, mismatch: 0, dead_letter: 0, retry: 0, db_error: 0 };

  const effect = async (db, msg, key) => {
    let body;
    try { body = JSON.parse(msg.content.toString('utf8')); } catch { throw new PermanentError('body is not JSON'); }
    if (!body || !Number.isInteger(body.amount)) throw new PermanentError('no integer amount');
    await db.query('INSERT INTO broker_effects (message_id, consumer, amount) VALUES ($1::text, $2::text, $3::int)',
      [key, consumerId, body.amount]);
    return { applied: true, amount: body.amount };
  };

  const consumer = await consume({
    channel, pool, queue: env.QUEUE || 'payments', prefetch,
    mode: mode === 'batch' ? 'batch' : mode === 'two_phase' ? 'two_phase' : 'single',
    leaseSeconds: Number(env.IDEM_LEASE_SECONDS || 30),
    handler: async (msg, ctx) => {
      if (mode !== 'two_phase') return effect(ctx.client, msg, ctx.key);
      // Outside effect on its own connection; the checkpoint right after it tells a later
      // reclaim (after a crash here) that it happened.
      if (ctx.recoveryPoint === 'effect-done') return { applied: true, recovered: true };
      const result = await effect(pool, msg, ctx.key);
      await ctx.checkpoint('effect-done');
      return result;
    },
    afterCommit: () => {
      commits += 1;
      if (crashAfter > 0 && commits >= crashAfter) process.kill(process.pid, 'SIGKILL');
    },
    onEvent: (e) => { if (e.type in counts) counts[e.type] += 1; },
    onError: (err) => console.error(`[${consumerId}] ${err && err.message}`),
  });
  console.log(`[${consumerId}] consuming ${env.QUEUE} (${mode}, prefetch ${prefetch})`);

  let stopping = false;
  const stop = async (signal) => {
    stopping = true;
    console.log(`[${consumerId}] ${signal}: stopping`);
    await consumer.stop();
    await channel.close().catch(() => {});
    await conn.close().catch(() => {});
    await pool.end();
    console.log(`[${consumerId}] stopped ${JSON.stringify(counts)}`);
    process.exit(0);
  };
  process.once('SIGTERM', () => { stop('SIGTERM'); });
  process.once('SIGINT', () => { stop('SIGINT'); });
  // READY_FILE (the broker harness): created once SIGTERM stops the consumer gracefully.
  if (env.READY_FILE) fs.writeFileSync(env.READY_FILE, '');
  conn.on('close', () => {
    if (stopping) return;
    console.error(`[${consumerId}] broker connection closed`);
    process.exit(3);
  });
}

main().catch((err) => {
  console.error(`[${consumerId}] ${err.stack || err}`);
  process.exit(1);
});
