#!/usr/bin/env python3
"""A batch consumer (Kafka, SQS, RabbitMQ prefetch...) made idempotent, one transaction per batch.

For every batch of messages, ONE transaction and three round trips, whatever the batch size:

    idempotency.claim_keys(message ids, fingerprints of the payloads)   -- one row per message
    business writes for the claimed messages only (here: one INSERT .. SELECT FROM unnest)
    idempotency.complete_keys(claimed ids, their tokens, their outcomes)
    COMMIT                                      -- then acknowledge the batch to the broker

The keys and the effects commit together or not at all: a crash anywhere before COMMIT rolls
the whole batch back, and the redelivered batch is claimed afresh. Per message:
  claimed / reclaimed   apply it (reclaimed: a previous holder's lease ended)
  replay                a duplicate of a message already applied: skip it
  mismatch              the same id with another payload: dead-letter it
  in_progress           another consumer holds it right now, or it is a repeat of a message
                        earlier in this same batch (claim_keys answers the first occurrence
                        of a key and gives later ones in_progress): the repeat is skipped,
                        another consumer's message is retried in a later batch
No per-key lock is kept, so a batch may hold thousands of keys in one transaction.

Usage:
    batch_consumer.py [--dsn DSN] [--setup [--setup-dsn DSN]] [--batch-size 100]
                      [--crash-batch 2] [messages.jsonl ...]

Messages are JSON lines: {"id": "m-1", "account": "alice", "amount": 100} (the file of
consumer.py works). Reads stdin when no file is given. Prints one line per batch and, at the
end, the balances and a check that no message was applied twice. Its tables are its own,
batch_accounts and batch_ledger. Needs psycopg 3 (Debian: python3-psycopg) and the
idempotency extension 1.1 or later in the database; the connection comes from --dsn, else
from the PG* environment. The role needs USAGE on schema idempotency (a superuser grants it);
--setup creates the tables, through --setup-dsn when the role may not (they are then granted
to it).
"""

import argparse
import json
import sys
import time

import psycopg

from consumer import setup  # consumer.py, beside this file: the tables' set-up and grants

SCOPE = "payments-batch-consumer"

SETUP_SQL = """
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE IF NOT EXISTS batch_accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
-- Deliberately no unique constraint on message_id: only the idempotency keys keep an
-- effect from being applied twice.
CREATE TABLE IF NOT EXISTS batch_ledger (
  entry bigserial PRIMARY KEY, message_id text NOT NULL, account text NOT NULL,
  amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
"""
# When another role (a superuser) sets up: the grants the consumer's role needs.
GRANT_SQL = """
GRANT USAGE ON SCHEMA idempotency TO {role};
GRANT SELECT, INSERT, UPDATE ON batch_accounts, batch_ledger TO {role};
GRANT USAGE ON SEQUENCE batch_ledger_entry_seq TO {role};
"""

# One row per message, in input order. The fingerprints are computed by the server from the
# payloads (request_fingerprint(jsonb): equal JSON gives equal digests whatever the spacing).
CLAIM_SQL = """
SELECT c.ordinality, c.key, c.status::text, c.token, c.response,
       extract(epoch FROM c.retry_after)::float8
  FROM idempotency.claim_keys(
         %(ids)s::text[],
         ARRAY(SELECT idempotency.request_fingerprint(p) FROM unnest(%(payloads)s::text[]::jsonb[])
                 WITH ORDINALITY AS u(p, n) ORDER BY n),
         %(scope)s::text) c
 ORDER BY c.ordinality
"""

# The business writes of all claimed messages in one statement. Accounts are updated in
# the order of their ids, so that concurrent consumers lock them in one order (no deadlock).
APPLY_SQL = """
WITH m AS (SELECT * FROM unnest(%(ids)s::text[], %(accounts)s::text[], %(amounts)s::bigint[]) AS m(id, account, amount)),
     l AS (INSERT INTO batch_ledger (message_id, account, amount) SELECT id, account, amount FROM m),
     total AS (SELECT account, sum(amount) AS amount FROM m GROUP BY account)
INSERT INTO batch_accounts (id, balance) SELECT account, amount FROM total ORDER BY account
    ON CONFLICT (id) DO UPDATE SET balance = batch_accounts.balance + EXCLUDED.balance
RETURNING id, balance
"""

COMPLETE_SQL = """
SELECT count(*) FROM idempotency.complete_keys(%(ids)s::text[], %(tokens)s::uuid[],
                                               %(responses)s::text[]::jsonb[], NULL::int[], %(scope)s::text)
"""


class SimulatedCrash(Exception):
    pass


def handle_batch(conn, batch, opts, crash):
    """Processes one batch in one transaction. Returns the messages to retry later."""
    ids = [m["id"] for m in batch]
    with conn.transaction():
        with conn.cursor() as cur:
            cur.execute(CLAIM_SQL, {"ids": ids, "payloads": [m["raw"] for m in batch], "scope": SCOPE})
            rows = cur.fetchall()
            counts = {}
            claimed, retry, first_seen = [], [], set()
            for (ordinality, key, status, token, response, retry_after), msg in zip(rows, batch):
                assert key == msg["id"], "claim_keys answers in input order"
                if status in ("claimed", "reclaimed"):
                    claimed.append((msg, token))
                elif status == "in_progress" and key in first_seen:
                    status = "repeat"  # a repeat of a message earlier in this batch
                elif status == "in_progress":
                    retry.append(msg)  # another consumer holds it: later
                counts[status] = counts.get(status, 0) + 1
                first_seen.add(key)
            if claimed:
                cur.execute(APPLY_SQL, {
                    "ids": [m["id"] for m, _ in claimed],
                    "accounts": [m["account"] for m, _ in claimed],
                    "amounts": [m["amount"] for m, _ in claimed],
                })
                balances = dict(cur.fetchall())
                if opts.batch_delay:
                    time.sleep(opts.batch_delay)  # a slow handler: other consumers see in_progress
                if crash:
                    raise SimulatedCrash("crash after the business writes, before COMMIT")
                cur.execute(COMPLETE_SQL, {
                    "ids": [m["id"] for m, _ in claimed],
                    "tokens": [t for _, t in claimed],
                    "responses": [json.dumps({"account": m["account"], "balance": balances[m["account"]]})
                                  for m, _ in claimed],
                    "scope": SCOPE,
                })
    log(opts, f"batch of {len(batch)}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return retry


def log(opts, line):
    print(f"[{opts.name}] {line}", flush=True)


def batches(streams, size):
    batch = []
    for stream in streams:
        for raw in stream:
            raw = raw.strip()
            if raw:
                msg = json.loads(raw)
                msg["raw"] = raw
                batch.append(msg)
                if len(batch) == size:
                    yield batch
                    batch = []
    if batch:
        yield batch


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default="", help="libpq connection string (default: PG* environment)")
    p.add_argument("--setup", action="store_true", help="create the tables this consumer writes")
    p.add_argument("--setup-dsn", default=None,
                   help="connection for --setup when the consumer's role may not create them (default: --dsn)")
    p.add_argument("--name", default="batch-consumer", help="label for the log lines")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--crash-batch", type=int, action="append", default=[], metavar="N",
                   help="simulate a crash in batch N (1-based) after its writes, once")
    p.add_argument("--batch-delay", type=float, default=0, help="sleep inside each batch's transaction (s)")
    p.add_argument("--max-rounds", type=int, default=10, help="redeliveries of deferred messages")
    p.add_argument("--retry-sleep", type=float, default=0.5)
    p.add_argument("files", nargs="*")
    opts = p.parse_args()

    with psycopg.connect(opts.dsn, autocommit=True) as conn:
        if opts.setup:
            setup(conn, opts.setup_dsn, SETUP_SQL, GRANT_SQL)
        crashes = set(opts.crash_batch)
        streams = [open(f, encoding="utf-8") for f in opts.files] or [sys.stdin]
        deferred = []
        for number, batch in enumerate(batches(streams, opts.batch_size), start=1):
            while True:
                try:
                    deferred += handle_batch(conn, batch, opts, number in crashes)
                    break
                except SimulatedCrash as e:
                    # The transaction rolled back: no ledger row, no key. Redeliver the batch.
                    crashes.discard(number)
                    log(opts, f"batch {number} crashed ({e}); rolled back, redelivering")
                except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as e:
                    # A transient conflict of the business writes: the batch rolled back
                    # whole (keys included), so it is simply delivered again.
                    log(opts, f"batch {number} rolled back ({type(e).__name__}); redelivering")
        for _ in range(opts.max_rounds):
            if not deferred:
                break
            time.sleep(opts.retry_sleep)
            deferred = handle_batch(conn, deferred, opts, False)
        if deferred:
            log(opts, f"{len(deferred)} message(s) still in progress elsewhere; left for redelivery")
        rows = conn.execute("SELECT id, balance FROM batch_accounts ORDER BY id").fetchall()
        log(opts, "balances " + json.dumps(dict(rows), sort_keys=True))
        (twice,) = conn.execute(
            "SELECT count(*) FROM (SELECT message_id FROM batch_ledger GROUP BY message_id HAVING count(*) > 1) d"
        ).fetchone()
        log(opts, f"messages applied more than once: {twice}")
        sys.exit(1 if twice else 0)


if __name__ == "__main__":
    main()
