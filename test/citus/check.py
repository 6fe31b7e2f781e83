#!/usr/bin/python3
"""The claim protocol through a Citus coordinator (test/suites/citus.sh starts the cluster).

  check.py COORDINATOR_DSN WORKER_DSN...

Runs as the application roles citus_app and citus_other (USAGE on schema idempotency only)
and prints one "ok"/"not ok" line per assertion, then "N passed, N failed".
"""
import os
import sys
import threading
import time

import psycopg
from psycopg import errors

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from tap_count import check, finish  # noqa: E402

coordinator = sys.argv[1]
workers = sys.argv[2:]


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

# Batches (1.1). claim_keys / complete_keys take arrays, so Citus cannot delegate them by a
# key: they run on the coordinator, whose executor routes each key's statements to its shard.
# Their key lock is the coordinator's, so batches see each other's open claims at once; a
# delegated single-key call takes its key lock on the shard's node instead (docs/design.md,
# "Citus").
admin = psycopg.connect(coordinator, autocommit=True)


def batch(conn, keys, fingerprints=None, sql="claim_keys"):
    return conn.execute("SELECT key, status::text, token, response FROM idempotency.%s(%%s, %%s)" % sql,
                        (keys, fingerprints)).fetchall()


def statuses(rows):
    return [r[1] for r in rows]


def complete_batch(conn, keys, tokens, responses, codes=None):
    """complete_keys' statuses, or the SQLSTATE it failed with."""
    try:
        return [r[0] for r in conn.execute("SELECT status::text FROM idempotency.complete_keys(%s, %s, %s::jsonb[], %s)",
                                           (keys, tokens, responses, codes)).fetchall()]
    except psycopg.Error as e:
        return e.sqlstate


rows = batch(app, ["b-1", "b-2", "b-1", "b-3"], [b"\x01", b"\x02", b"\x01", b"\x03"])
check("a batch through the coordinator claims each new key; a key repeated in it is in_progress",
      statuses(rows) == ["claimed", "claimed", "in_progress", "claimed"], statuses(rows))
tokens = {k: t for k, st, t, _ in rows if st == "claimed"}
done = complete_batch(app, ["b-1", "b-2"], [tokens["b-1"], tokens["b-2"]], ['{"n": 1}', '{"n": 2}'], [200, 201])
check("complete_keys through the coordinator", done == ["replay", "replay"], done)
rows = batch(app, ["b-1", "b-2", "b-3", "b-4"], [b"\x01", b"\x09", b"\x03", None])
check("a second batch: replay, mismatch, in_progress (live lease), claimed",
      statuses(rows) == ["replay", "mismatch", "in_progress", "claimed"] and rows[0][3] == {"n": 1},
      [(r[1], r[3]) for r in rows])
s, _, response, _ = claim(app, "b-2", fingerprint=b"\x02")
check("a key completed by complete_keys replays through the delegated claim_key",
      s == "replay" and response == {"n": 2}, (s, response))
s, t, _, _ = claim(app, "b-single")
done = complete_batch(app, ["b-single"], [t], ['{"one": 1}'])
rows = batch(app, ["b-single"])
check("a key claimed by the delegated claim_key completes and replays through the batch functions",
      done == ["replay"] and statuses(rows) == ["replay"] and rows[0][3] == {"one": 1}, (done, rows))
# Fencing in a batch: a lease that ended is reclaimed, the old token is fenced.
old_token = app.execute("SELECT token FROM idempotency.claim_keys(ARRAY['b-lease'], lease => '1 second')").fetchone()[0]
time.sleep(1.3)
rows = batch(app, ["b-lease"])
fenced = complete_batch(app, ["b-lease"], [old_token], ['{}'])
done = complete_batch(app, ["b-lease"], [rows[0][2]], ['{}'])
check("a batch reclaims an ended lease; complete_keys fences the old token (55000) and takes the new one",
      statuses(rows) == ["reclaimed"] and fenced == "55000" and done == ["replay"], (statuses(rows), fenced, done))

with app.transaction():
    batch(app, ["b-rollback-1", "b-rollback-2"])
    left_inside = admin.execute("SELECT count(*) FROM idempotency.idempotency_keys"
                                " WHERE key LIKE 'b-rollback-%'").fetchone()[0]
    app.execute("ROLLBACK")  # ends the block; psycopg then sees no transaction to commit
left = admin.execute("SELECT count(*) FROM idempotency.idempotency_keys WHERE key LIKE 'b-rollback-%'").fetchone()[0]
check("a batch in a transaction that rolls back leaves no key on any shard",
      left_inside == 0 and left == 0 and statuses(batch(app, ["b-rollback-1"])) == ["claimed"], (left_inside, left))

# A batch holding keys in an open transaction: another batch answers in_progress at once.
holder = connect("citus_app")
holder.autocommit = False
batch(holder, ["b-open-1", "b-open-2"])
started = time.monotonic()
rows = batch(app, ["b-open-2", "b-open-3"])
check("a batch sees keys another batch holds in an open transaction as in_progress at once",
      statuses(rows) == ["in_progress", "claimed"] and time.monotonic() - started < 1.0,
      (statuses(rows), time.monotonic() - started))


def in_thread(fn):
    """Runs fn() in a thread; returns (thread, result dict with 'value' or 'error')."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except psycopg.Error as e:
            out["error"] = e.sqlstate

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


# The limit: a delegated single claim and a coordinator-side batch take their key locks on
# different nodes, so each WAITS for the other's open transaction (the unique index of the
# shard decides, as in the executor path) instead of answering in_progress. Never a second
# winner: the waiter gets what a duplicate gets once the holder ends.
late = connect("citus_app")
thread, out = in_thread(lambda: claim(late, "b-open-1")[0])
time.sleep(1.0)
waited = thread.is_alive()
holder.commit()
thread.join(15)
check("limit: a delegated claim_key of a key a batch holds open waits for it, then is in_progress (one winner)",
      waited and out.get("value") == "in_progress", (waited, out))
holder.execute("SELECT idempotency.claim_key('b-held')")
thread, out = in_thread(lambda: statuses(batch(late, ["b-new", "b-held"])))
time.sleep(1.0)
waited = thread.is_alive()
holder.rollback()
thread.join(15)
check("limit: a batch with a key a delegated claim_key holds open waits for it, then claims it after a rollback",
      waited and out.get("value") == ["claimed", "claimed"], (waited, out))

# The other limit: one transaction cannot mix a delegated call and a coordinator-side call on
# one shard (Citus' 25001: the delegated call reaches the shard as the caller, the batch as
# the extension owner), and the failed transaction leaves nothing.
with app.transaction():
    claim(app, "b-mixed")
    mixed = sqlstate(app, "SELECT * FROM idempotency.claim_keys(ARRAY['b-mixed'])")
    app.execute("ROLLBACK")
left = admin.execute("SELECT count(*) FROM idempotency.idempotency_keys WHERE key = 'b-mixed'").fetchone()[0]
check("limit: a delegated claim_key and claim_keys of one shard in one transaction fail with 25001, leaving nothing",
      mixed == "25001" and left == 0, (mixed, left))

# A batch racing single claims of the same keys: exactly one winner per key.
race_keys = ["b-race-%d" % i for i in range(40)]
racer = connect("citus_app")
go = threading.Event()


def singles():
    go.wait()
    return [claim(racer, k)[0] for k in reversed(race_keys)]


def whole_batch():
    go.wait()
    return statuses(batch(late, race_keys))


t1, single_out = in_thread(singles)
t2, batch_out = in_thread(whole_batch)
go.set()
t1.join(30)
t2.join(30)
won = {k: 0 for k in race_keys}
for k, st in zip(reversed(race_keys), single_out.get("value", [])):
    won[k] += st == "claimed"
for k, st in zip(race_keys, batch_out.get("value", [])):
    won[k] += st == "claimed"
check("a batch racing single claims of its 40 keys: exactly one winner per key",
      all(n == 1 for n in won.values()) and "error" not in single_out and "error" not in batch_out,
      (sorted(set(won.values())), single_out.get("error"), batch_out.get("error")))

# Keys are spread over the workers' shards.
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

finish()
