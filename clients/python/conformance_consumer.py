#!/usr/bin/env python3
"""The conformance consumer (clients/conformance/CONTRACT.md, "The broker consumer").

Environment: AMQP_URL, DATABASE_URL, QUEUE, CONSUMER_MODE (single, batch, two_phase), PREFETCH
(default 50), CONSUMER_ID, CRASH_AFTER_COMMIT (N: SIGKILL itself after the Nth COMMIT, before
the ack), IDEM_LEASE_SECONDS (the two_phase lease; default: the server's). The effect of a message {"account": "a1", "amount": 5} is a row of broker_effects:
in the claim's transaction (single, batch) or, in two_phase, on a connection of its own in
autocommit after the claim's COMMIT. SIGTERM stops it gracefully. Prints its counts at the end.
"""

import json
import logging
import os
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))

import pika  # noqa: E402
import psycopg  # noqa: E402

from idempotency.consumer import Consumer  # noqa: E402

INSERT = "INSERT INTO broker_effects (message_id, consumer, amount) VALUES (%s::text, %s::text, %s::int)"


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    env = os.environ
    mode = env.get("CONSUMER_MODE", "single")
    consumer_id = env.get("CONSUMER_ID", f"python-{os.getpid()}")
    database_url = env.get("DATABASE_URL", "")
    crash_after = int(env.get("CRASH_AFTER_COMMIT") or 0)
    commits = 0
    effects = psycopg.connect(database_url, autocommit=True) if mode == "two_phase" else None

    def handler(ctx):
        amount = int(json.loads(ctx.body)["amount"])
        conn = effects if effects is not None else ctx.connection
        conn.execute(INSERT, (ctx.key, consumer_id, amount))
        return {"applied": amount}

    def on_commit(deliveries):
        nonlocal commits
        commits += 1
        if crash_after and commits >= crash_after:
            os.kill(os.getpid(), signal.SIGKILL)  # after COMMIT, before the ack

    lease = float(env["IDEM_LEASE_SECONDS"]) if env.get("IDEM_LEASE_SECONDS") else None
    consumer = Consumer(database_url, handler, mode=mode, prefetch=int(env.get("PREFETCH") or 50),
                        lease_seconds=lease if mode == "two_phase" else None, on_commit=on_commit)
    # READY_FILE (the broker harness): created once SIGTERM stops the consumer gracefully (run()
    # installs the same handler again).
    signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
    if env.get("READY_FILE"):
        open(env["READY_FILE"], "w").close()
    consumer.run(pika.URLParameters(env["AMQP_URL"]), env["QUEUE"])
    print(json.dumps({"consumer": consumer_id, "mode": mode, "commits": commits, **consumer.counts}), flush=True)


if __name__ == "__main__":
    main()
