#!/usr/bin/env python3
"""An at-least-once message consumer made idempotent with the inbox pattern.

For every message, ONE transaction:

    idempotency.claim_key(message id, fingerprint of the payload)   -- inside the transaction
    business write (here: a ledger row and a balance update)
    idempotency.complete_key(message id, token, outcome)
    COMMIT

The key and the effect commit together or not at all: a crash anywhere before COMMIT
rolls both back, and the redelivered message is claimed afresh. A duplicate gets
`replay` (skip it, the effect is already there), a duplicate that arrives while the
first copy is still being processed gets `in_progress` (retry after `retry_after`), and
a different payload under an id already used gets `mismatch` (dead-letter it).

Usage:
    consumer.py [--dsn DSN] [--setup [--setup-dsn DSN]] [--crash-once ID] [messages.jsonl ...]

Messages are JSON lines: {"id": "m-1", "account": "alice", "amount": 100}. Reads stdin
when no file is given. Prints one line per delivery and, at the end, the balances.
Needs psycopg 3 (Debian: python3-psycopg) and the idempotency extension in the database.
The connection comes from --dsn, else from the PG* environment (PGHOST, PGPORT, PGDATABASE,
PGUSER, PGPASSWORD).

The consumer runs as an ordinary application role, which needs USAGE on the extension's
schema, `idempotency` (GRANT USAGE ON SCHEMA idempotency TO app, by a superuser), and calls
the functions schema-qualified. --setup creates the tables this consumer writes; when the
consumer's role may not (it does not own the database), pass --setup-dsn, a connection of a
role that may, and the tables are granted to the consumer's role.
"""

import argparse
import json
import sys
import time

import psycopg

SCOPE = "payments-consumer"  # a namespace of keys per consumer (keys of others never clash)

SETUP_SQL = """
CREATE EXTENSION IF NOT EXISTS idempotency;
CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);
-- Deliberately no unique constraint on message_id: only the idempotency key keeps the
-- effect from being applied twice.
CREATE TABLE IF NOT EXISTS ledger (
  entry bigserial PRIMARY KEY, message_id text NOT NULL, account text NOT NULL,
  amount bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
"""
# When another role (a superuser) sets up: the grants the consumer's role needs.
GRANT_SQL = """
GRANT USAGE ON SCHEMA idempotency TO {role};
GRANT SELECT, INSERT, UPDATE ON accounts, ledger TO {role};
GRANT USAGE ON SEQUENCE ledger_entry_seq TO {role};
"""


class SimulatedCrash(Exception):
    pass


def apply_payment(cur, msg):
    """The business write. Runs only for a claimed key, inside the claim's transaction."""
    cur.execute(
        "INSERT INTO accounts (id, balance) VALUES (%(account)s, %(amount)s) "
        "ON CONFLICT (id) DO UPDATE SET balance = accounts.balance + EXCLUDED.balance "
        "RETURNING balance",
        msg,
    )
    (balance,) = cur.fetchone()
    cur.execute(
        "INSERT INTO ledger (message_id, account, amount) VALUES (%(id)s, %(account)s, %(amount)s)",
        msg,
    )
    return {"account": msg["account"], "balance": balance}


def handle(conn, raw, opts, crashes_left):
    """Processes one delivery. Returns a one-word outcome for the log line."""
    msg = json.loads(raw)
    for attempt in range(1, opts.max_attempts + 1):
        try:
            with conn.transaction():
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT status::text, token, response, "
                        "       extract(epoch FROM retry_after)::float8 "
                        "  FROM idempotency.claim_key(%s::text, idempotency.request_fingerprint(%s::jsonb),"
                        "                             %s::text, wait => %s::interval)",
                        (msg["id"], raw, SCOPE, f"{opts.wait} seconds"),
                    )
                    status, token, response, retry_after = cur.fetchone()
                    if status in ("claimed", "reclaimed"):
                        outcome = apply_payment(cur, msg)
                        if opts.work_delay:
                            time.sleep(opts.work_delay)  # a slow handler: duplicates see in_progress
                        if crashes_left.get(msg["id"], 0) > 0:
                            crashes_left[msg["id"]] -= 1
                            raise SimulatedCrash("crash after the business write")
                        cur.execute(
                            "SELECT 1 FROM idempotency.complete_key(%s::text, %s::uuid, %s::jsonb, 200, %s::text)",
                            (msg["id"], token, json.dumps(outcome), SCOPE),
                        )
                        return f"{status} applied balance={outcome['balance']}"
                    if status == "replay":
                        return f"replay skipped (first delivery left balance={response['balance']})"
                    if status == "mismatch":
                        return "mismatch dead-lettered (same id, different payload)"
                    # in_progress: another consumer holds the key right now. Leave the
                    # transaction (nothing was written) and try again a little later.
            pause = min(retry_after or 0.1, opts.max_retry_sleep)
            log(opts, f"{msg['id']}\tin_progress (attempt {attempt}), retrying in {pause:.1f}s")
            time.sleep(pause)
        except SimulatedCrash as e:
            # The transaction rolled back: no ledger row, no key. The broker redelivers.
            log(opts, f"{msg['id']}\tcrashed ({e}); rolled back, redelivering")
    return "deferred (still in progress; left for redelivery)"


def setup(conn, setup_dsn, setup_sql=SETUP_SQL, grant_sql=GRANT_SQL):
    """Creates the tables (setup_sql) on conn, or on setup_dsn's connection when given; grants
    them (grant_sql) to conn's role when setup_dsn's role is another. batch_consumer.py uses it
    too, with its own tables."""
    (role,) = conn.execute("SELECT quote_ident(current_user)").fetchone()
    if setup_dsn is None:
        conn.execute(setup_sql)
        return
    with psycopg.connect(setup_dsn, autocommit=True) as admin:
        admin.execute(setup_sql)
        (admin_role,) = admin.execute("SELECT quote_ident(current_user)").fetchone()
        if admin_role != role:
            admin.execute(grant_sql.format(role=role))


def log(opts, line):
    print(f"[{opts.name}] {line}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dsn", default="", help="libpq connection string (default: PG* environment)")
    p.add_argument("--setup", action="store_true", help="create the tables this consumer writes")
    p.add_argument("--setup-dsn", default=None,
                   help="connection for --setup when the consumer's role may not create them (default: --dsn)")
    p.add_argument("--name", default="consumer", help="label for the log lines")
    p.add_argument("--wait", type=float, default=0, help="claim_key wait, seconds (default 0)")
    p.add_argument("--work-delay", type=float, default=0, help="sleep inside the transaction (s)")
    p.add_argument("--max-attempts", type=int, default=10)
    p.add_argument("--max-retry-sleep", type=float, default=2.0)
    p.add_argument("--crash-once", action="append", default=[], metavar="ID",
                   help="simulate a crash after the business write of message ID, once")
    p.add_argument("files", nargs="*")
    opts = p.parse_args()

    with psycopg.connect(opts.dsn, autocommit=True) as conn:
        if opts.setup:
            setup(conn, opts.setup_dsn)
        crashes_left = {i: 1 for i in opts.crash_once}
        streams = [open(f, encoding="utf-8") for f in opts.files] or [sys.stdin]
        for stream in streams:
            for raw in stream:
                raw = raw.strip()
                if raw:
                    log(opts, f"{json.loads(raw)['id']}\t{handle(conn, raw, opts, crashes_left)}")
        rows = conn.execute("SELECT id, balance FROM accounts ORDER BY id").fetchall()
        log(opts, "balances " + json.dumps(dict(rows), sort_keys=True))


if __name__ == "__main__":
    main()
