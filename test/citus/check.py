#!/usr/bin/python3
"""The claim protocol through a Citus coordinator (test/suites/citus.sh starts the cluster).

  check.py COORDINATOR_DSN WORKER_DSN...

Runs as the application roles citus_app and citus_other (USAGE on schema idempotency only)
and prints one "ok"/"not ok" line per assertion, then "N passed, N failed".
"""
import sys
import threading
import time

import psycopg
from psycopg import errors

coordinator = sys.argv[1]
workers = sys.argv[2:]
passed = failed = 0


def check(name, condition, detail=""):
    global passed, failed
    if condition:
        passed += 1
        print("ok - " + name)
    else:
        failed += 1
        print("not ok - %s %s" % (name, detail))
    sys.stdout.flush()


def connect(role, dsn=coordinator):
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET ROLE " + role)
    return conn


def claim(conn, key, **kw):
    args = ", ".join(["%s"] + ["%s => %%s" % k for k in kw])
    return conn.execute("SELECT status::text, token, response, retry_after FROM idempotency.claim_key(" + args + ")",
                        [key] + list(kw.values())).fetchone()


def sqlstate(conn, sql, params=()):
    try:
        conn.execute(sql, params)
        return "ok"
    except psycopg.Error as e:
        return e.sqlstate


app = connect("citus_app")
other = connect("citus_other")

# Statuses.
status, token, _, _ = claim(app, "c-1", fingerprint=b"\x01")
check("claimed through the coordinator", status == "claimed" and token is not None, status)
check("a duplicate with a live lease is in_progress", claim(app, "c-1", fingerprint=b"\x01")[0] == "in_progress")
check("another payload is a mismatch", claim(app, "c-1", fingerprint=b"\x02")[0] == "mismatch")
with app.transaction():
    s, t, _, _ = claim(app, "c-2")
    app.execute("SELECT idempotency.complete_key(%s, %s, %s, 201)", ("c-2", t, '{"paid": 1}'))
s, _, response, _ = claim(app, "c-2")
check("the inbox pattern replays the stored response", s == "replay" and response == {"paid": 1}, (s, response))

# A claim in a transaction still open: in_progress at once (the key lock is node-local, and
# every call for the key runs on the same node).
holder = connect("citus_app")
holder.autocommit = False
holder.execute("SELECT idempotency.claim_key('c-open')")
started = time.monotonic()
s, _, _, retry = claim(app, "c-open")
check("a claim in an open transaction answers in_progress at once",
      s == "in_progress" and time.monotonic() - started < 1.0, (s, time.monotonic() - started))

# Waiting: the holder completes and commits while a duplicate waits.
result = {}


def waiter():
    conn = connect("citus_app")
    result["status"] = claim(conn, "c-open", wait="10 seconds")[0]
    conn.close()


thread = threading.Thread(target=waiter)
thread.start()
time.sleep(0.5)
holder.rollback()
thread.join(15)
check("a waiting duplicate claims the key once the holder rolls back", result.get("status") == "claimed", result)

# Fencing: a lease that ended is reclaimed, and the old holder is fenced out.
s1, old, _, _ = claim(app, "c-fence", lease="1 second")
time.sleep(1.3)
s2, new, _, _ = claim(app, "c-fence")
check("an ended lease is reclaimed", s1 == "claimed" and s2 == "reclaimed", (s1, s2))
check("the old holder's completion is fenced (55000)",
      sqlstate(app, "SELECT idempotency.complete_key(%s, %s, '{}')", ("c-fence", old)) == "55000")
check("the new holder completes",
      sqlstate(app, "SELECT idempotency.complete_key(%s, %s, '{}')", ("c-fence", new)) == "ok")

# Per-role keys: another role's key of the same name is another key.
s, _, _, _ = claim(other, "c-1", fingerprint=b"\x02")
check("another role's claim of the same key is its own (claimed)", s == "claimed", s)
check("another role cannot complete with a stolen token (P0002)",
      sqlstate(other, "SELECT idempotency.complete_key(%s, %s, '{}')", ("c-2", t)) == "P0002")

# A NULL key: 22004, never the Citus crash (src/citus_guard.cpp).
for sql in ("SELECT idempotency.claim_key(NULL)", "SELECT * FROM idempotency.claim_key(NULL)",
            "SELECT idempotency.complete_key(NULL, gen_random_uuid(), '{}')"):
    check("NULL key: %s -> 22004" % sql, sqlstate(app, sql) == "22004")
check("the coordinator is still up after the NULL keys", app.execute("SELECT 1").fetchone()[0] == 1)

# Keys are spread over the workers' shards.
admin = psycopg.connect(coordinator, autocommit=True)
for i in range(200):
    claim(app, "spread-%d" % i)


def local_rows(dsn):
    """Rows in the shard placements of idempotency_keys on one node."""
    conn = psycopg.connect(dsn, autocommit=True)
    shards = conn.execute(
        "SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)"
        " WHERE s.logicalrelid = 'idempotency.idempotency_keys'::regclass"
        " AND p.groupid = (SELECT groupid FROM pg_dist_local_group)").fetchall()
    total = sum(conn.execute("SELECT count(*) FROM idempotency.idempotency_keys_%d" % shard).fetchone()[0]
                for (shard,) in shards)
    conn.close()
    return total


counts = [local_rows(w) for w in workers]
per_node = local_rows(coordinator)
check("keys live in the shards of every worker, none on the coordinator",
      all(c > 0 for c in counts) and per_node == 0, (per_node, counts))

# The cleanup worker of each node deletes the expired keys of its own shards.
for i in range(300):
    claim(app, "expire-%d" % i, ttl="1 millisecond", lease="1 millisecond")
deadline = time.monotonic() + 30
left = None
while time.monotonic() < deadline:
    left = admin.execute("SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'expire-%'").fetchone()[0]
    if left == 0:
        break
    time.sleep(0.5)
check("the workers' cleanup deleted the expired keys from the shards", left == 0, left)
live = admin.execute("SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'spread-%'").fetchone()[0]
check("and no live key", live == 200, live)
shell = admin.execute("SELECT pg_relation_size('idempotency.idempotency_keys')").fetchone()[0]
check("the coordinator's shell table stays empty", shell == 0, shell)
errors_seen = admin.execute("SELECT count(*) FROM idempotency.idempotency_stats WHERE last_error IS NOT NULL").fetchone()[0]
check("no cleanup round failed on the coordinator", errors_seen == 0, errors_seen)

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
