// A typed use of the package, checked by tsc --noEmit (test/suites/client_node.sh): the
// declarations in index.d.ts describe what a TypeScript user writes.
import express from 'express';
import { Pool } from 'pg';
import type { Channel } from 'amqplib';
import { idempotency, policyHandler, parseKey, consume, PermanentError, type MessageContext } from '..';

const pool = new Pool();
const idem = idempotency({ pool, scope: (req) => req.get('X-Tenant') ?? 'default', mode: 'inbox', waitMs: 0 });
const app = express();
app.get('/idempotency-policy', idem.policy);
app.get('/policy-too', policyHandler({ ttlSeconds: 3600 }));
app.post('/payments', idem, async (req, res) => {
  const client = req.idempotency?.client;
  if (!client) throw new Error('inbox mode gives the claim\'s client');
  const { rows } = await client.query<{ id: string }>('INSERT INTO payments (amount) VALUES ($1::int) RETURNING id', [req.body.amount]);
  res.status(201).json({ id: rows[0].id, key: req.idempotency?.key, bytes: req.rawBody?.length });
});
const key: string = parseKey('"abc"');

export async function run(channel: Channel): Promise<void> {
  const consumer = await consume({
    channel, pool, queue: 'payments', mode: 'batch', prefetch: 50,
    handler: async (msg, ctx: MessageContext) => {
      if (msg.content.length === 0) throw new PermanentError('empty');
      await ctx.client?.query('INSERT INTO effects (id) VALUES ($1::text)', [ctx.key]);
      return { applied: true, key };
    },
    afterCommit: ({ messages }) => { void messages.length; },
  });
  await consumer.stop();
}
