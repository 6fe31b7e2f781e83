#!/usr/bin/env python3
"""Wait handoff latency: how long after the holder's COMMIT a waiting claim_key returns.

The holder claims and completes a key in an open transaction; the waiter calls claim_key
with wait = 10 s on another connection and blocks; the holder commits. The handoff is the
waiter's return (server clock at the end of claim_key) minus the holder's COMMIT start
(server clock just before COMMIT), so it includes the commit itself (with
synchronous_commit = on, its WAL flush) and the wake-up. Also reported: the waiter's return
minus the moment the holder's client saw its COMMIT return (client clock; negative when the
waiter returned first). Reports p50 / p90 / p99 / max in milliseconds. Needs psycopg 3.
"""
import argparse
import threading
import time

import psycopg


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dsn", required=True)
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--sleep", type=float, default=0.02, help="how long the waiter waits before the COMMIT (s)")
    p.add_argument("--synchronous-commit", default="on", help="the holder's synchronous_commit")
    opts = p.parse_args()
    holder = psycopg.connect(opts.dsn, autocommit=True)
    holder.execute("SELECT set_config('synchronous_commit', %s, false)", (opts.synchronous_commit,))
    holder.autocommit = False
    waiter = psycopg.connect(opts.dsn, autocommit=True)
    samples, after_ack, statuses = [], [], {}
    for i in range(opts.count):
        key = f"handoff-{time.time_ns()}-{i}"
        holder.execute("SELECT complete_key(%s, (claim_key(%s)).token, '{\"ok\": true}')", (key, key))
        result = {}

        def wait():
            row = waiter.execute(
                "SELECT status::text, extract(epoch FROM clock_timestamp())::float8 FROM claim_key(%s, wait => '10 s')",
                (key,)).fetchone()
            result["status"], result["at"] = row
            result["client"] = time.time()

        t = threading.Thread(target=wait)
        t.start()
        time.sleep(opts.sleep)
        (before,) = holder.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        holder.commit()
        acked = time.time()
        t.join()
        after_ack.append((result["client"] - acked) * 1000)
        statuses[result["status"]] = statuses.get(result["status"], 0) + 1
        samples.append((result["at"] - before) * 1000)
    def show(label, values):
        values.sort()
        pick = lambda q: values[min(len(values) - 1, int(q * len(values)))]
        print(f"  {label}: p50 {pick(0.5):.2f} ms, p90 {pick(0.9):.2f} ms, p99 {pick(0.99):.2f} ms, "
              f"max {values[-1]:.2f} ms")
    print(f"wait handoff, holder synchronous_commit = {opts.synchronous_commit} "
          f"({len(samples)} handoffs, statuses {statuses}):")
    show("waiter's return after the holder's COMMIT started (server clock)", samples)
    show("waiter's return after the holder's COMMIT returned (client clock)", after_ack)


if __name__ == "__main__":
    main()
