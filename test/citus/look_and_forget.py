#!/usr/bin/python3
"""look_key and forget_key (1.3) through a Citus coordinator, delegated by the recipe of
test/citus/setup.sql (test/suites/citus.sh starts the cluster).

  look_and_forget.py COORDINATOR_DSN WORKER_DSN...

On Citus every call goes through the executor: look_key reads the row and its xmax with a
statement on the shard's node, and a key claimed in a transaction still open has no row it can
see, only the node's key lock. Runs as citus_app and citus_other (USAGE on schema idempotency
only); prints one "ok"/"not ok" line per assertion, then "N passed, N failed".

No verdict depends on speed: a look or forget that waited for a holder would wait for as long as
the holder stays open, which is until the check is made, so each such call runs under a
statement_timeout (57014 when it waited) instead of being timed. The end of a lease is awaited
by polling the clock against the stored locked_until.
"""
import os
import sys
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from tap_count import check, finish  # noqa: E402

coordinator = sys.argv[1]
workers = sys.argv[2:]

admin = psycopg.connect(coordinator, autocommit=True)
# The keys of an earlier run against the same cluster go first.
admin.execute("DELETE FROM idempotency.idempotency_keys WHERE key LIKE 'lk-%'")


def connect(role, autocommit=True):
    conn = psycopg.connect(coordinator, autocommit=autocommit)
    # A call that waits for a holder open until the check ends fails with 57014.
    conn.execute("SET statement_timeout = '20s'")
    conn.execute("SET ROLE " + role)
    if not autocommit:
        conn.commit()
    return conn


def look(conn, key, fingerprint=None):
    """look_key's answer in one comparable string, or the SQLSTATE it failed with."""
    try:
        row = conn.execute(
            "SELECT status::text, token IS NOT NULL, coalesce(attempts::text, '-'),"
            " coalesce(response::text, '-'), coalesce(response_code::text, '-'),"
            " coalesce((retry_after > '0')::text, '-')"
            " FROM idempotency.look_key(%s, %s)", (key, fingerprint)).fetchone()
    except psycopg.Error as e:
        return e.sqlstate
    return "%s token=%s attempts=%s response=%s code=%s retry=%s" % row


def not_delegated_look(conn, key):
    """look_key's status in a form Citus does not delegate: the call runs on the coordinator."""
    try:
        return conn.execute("SELECT (idempotency.look_key(%s)).status::text", (key,)).fetchone()[0]
    except psycopg.Error as e:
        return e.sqlstate


def claim(conn, key, **kw):
    args = ", ".join(["%s"] + ["%s => %%s" % k for k in kw])
    return conn.execute("SELECT status::text, token, attempts FROM idempotency.claim_key(" + args + ")",
                        [key] + list(kw.values())).fetchone()


def result_of(conn, sql, params=()):
    """The first column of the statement's first row as text, or its SQLSTATE."""
    try:
        return str(conn.execute(sql, params).fetchone()[0])
    except psycopg.Error as e:
        return e.sqlstate


def await_lease_end(key, owner="citus_app"):
    """Polls until the stored lease of the key has ended by the coordinator's clock."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ended = admin.execute("SELECT clock_timestamp() > locked_until FROM idempotency.idempotency_keys"
                              " WHERE owner = %s AND scope = '' AND key = %s", (owner, key)).fetchone()
        if ended and ended[0]:
            return
        time.sleep(0.05)
    raise RuntimeError("the lease of %s did not end" % key)


def forgotten_on_workers():
    """The forgotten counters of database postgres on every worker (the calls run there)."""
    total = 0
    for dsn in workers:
        with psycopg.connect(dsn, autocommit=True) as conn:
            total += conn.execute("SELECT coalesce(sum(forgotten), 0) FROM idempotency.idempotency_stats"
                                  " WHERE datname = 'postgres'").fetchone()[0]
    return total


app = connect("citus_app")
other = connect("citus_other")
holder = connect("citus_app", autocommit=False)
forgotten_before = forgotten_on_workers()
ABSENT = "claimed token=False attempts=- response=- code=- retry=-"

# The recipe delegates both functions by their key, in transactions too.
delegated = admin.execute(
    "SELECT string_agg(format('%s:%s:%s', p.proname, d.distribution_argument_index, d.force_delegation), ' '"
    "                  ORDER BY p.proname)"
    " FROM pg_dist_object d JOIN pg_proc p ON p.oid = d.objid"
    " WHERE d.objid IN ('idempotency.look_key(text,bytea,text)'::regprocedure,"
    "                   'idempotency.forget_key(text,uuid,text)'::regprocedure)").fetchone()[0]
check("the recipe delegates look_key and forget_key by their key (force_delegation)",
      delegated == "forget_key:0:t look_key:0:t", delegated)

# A new key claimed in a transaction still open: no row anyone else can see, only the key lock
# of the shard's node, where the delegated look runs.
claim(holder, "lk-open")
check("a claim in an open transaction: look_key answers in_progress at once, no token",
      look(app, "lk-open") == "in_progress token=False attempts=- response=- code=- retry=true", look(app, "lk-open"))
check("a claim in an open transaction: another role's look finds no key of its own (claimed, no token)",
      look(other, "lk-open") == ABSENT, look(other, "lk-open"))
check("limit: a claim in an open transaction: a look Citus does not delegate answers claimed (the key lock is the"
      " worker's)", not_delegated_look(app, "lk-open") == "claimed", not_delegated_look(app, "lk-open"))
check("a claim in an open transaction: forget_key refuses at once (55000), it never waits",
      result_of(app, "SELECT idempotency.forget_key('lk-open')") == "55000")
check("a claim in an open transaction: another role's forget_key finds nothing (false)",
      result_of(other, "SELECT idempotency.forget_key('lk-open')") == "False")
# The look takes no lock it keeps: a looker whose transaction stays open blocks no one.
looker = connect("citus_app", autocommit=False)
first = look(looker, "lk-open")
holder.rollback()
second = look(looker, "lk-open")
s, _, _ = claim(app, "lk-open")
check("a look in a transaction still open keeps no lock: after the holder's rollback it answers claimed, and a claim"
      " from elsewhere takes the key", first.startswith("in_progress") and second == ABSENT and s == "claimed",
      (first, second, s))
looker.commit()
looker.close()
check("the new holder's committed claim: look_key answers in_progress with retry_after, no token",
      look(app, "lk-open") == "in_progress token=False attempts=1 response=- code=- retry=true", look(app, "lk-open"))

# A committed row another open transaction updates: the look reads its xmax on the shard's node.
claim(app, "lk-reclaim", lease="1 second")
await_lease_end("lk-reclaim")
check("a lease that ended: look_key answers reclaimed (attempts so far, no token)",
      look(app, "lk-reclaim") == "reclaimed token=False attempts=1 response=- code=- retry=-", look(app, "lk-reclaim"))
s, _, _ = claim(holder, "lk-reclaim")
seen = look(app, "lk-reclaim")
check("a take-over in an open transaction (the row's xmax): look_key answers in_progress at once, not reclaimed",
      s == "reclaimed" and seen == "in_progress token=False attempts=- response=- code=- retry=true", (s, seen))
# A call Citus does not delegate (docs/design.md, "Citus") runs on the coordinator, and its
# statement brings the row from the worker: the xmax there is the worker's transaction id,
# which only the worker can judge.
seen = not_delegated_look(app, "lk-reclaim")
check("a take-over in an open transaction: a look Citus does not delegate answers in_progress too (the worker"
      " judges its own xmax)", seen == "in_progress", seen)
check("a take-over in an open transaction: another role's look finds no key of its own",
      look(other, "lk-reclaim") == ABSENT, look(other, "lk-reclaim"))
holder.commit()
check("after the take-over commits: in_progress, attempt 2",
      look(app, "lk-reclaim") == "in_progress token=False attempts=2 response=- code=- retry=true",
      look(app, "lk-reclaim"))

# An expired key claimed again in an open transaction: the same, through the restart's update.
_, token, _ = claim(app, "lk-expired", ttl="1 second", lease="1 second")
app.execute("SELECT idempotency.complete_key('lk-expired', %s, '{}')", (token,))
deadline = time.monotonic() + 60
while admin.execute("SELECT clock_timestamp() <= expires_at FROM idempotency.idempotency_keys"
                    " WHERE owner = 'citus_app' AND key = 'lk-expired'").fetchone()[0]:
    if time.monotonic() > deadline:
        raise RuntimeError("lk-expired did not expire")
    time.sleep(0.05)
check("an expired key: look_key answers claimed and shows nothing of the old row",
      look(app, "lk-expired") == ABSENT, look(app, "lk-expired"))
s, _, _ = claim(holder, "lk-expired")
seen = look(app, "lk-expired")
holder.rollback()
check("an expired key claimed again in an open transaction: look_key answers in_progress at once",
      s == "claimed" and seen.startswith("in_progress token=False"), (s, seen))

# After completion: replay with the response, mismatch for another payload; another role's key
# of the same name does not exist for it.
_, token, _ = claim(app, "lk-done", fingerprint=b"\x01")
app.execute("SELECT idempotency.complete_key('lk-done', %s, '{\"paid\": 1}', 201)", (token,))
check("after completion: look_key answers replay with the response and its code, no token",
      look(app, "lk-done", b"\x01") == 'replay token=False attempts=1 response={"paid": 1} code=201 retry=-',
      look(app, "lk-done", b"\x01"))
check("after completion: another fingerprint is a mismatch, without the response",
      look(app, "lk-done", b"\x02") == "mismatch token=False attempts=1 response=- code=- retry=-",
      look(app, "lk-done", b"\x02"))
check("after completion: another role's look finds no key of its own", look(other, "lk-done", b"\x01") == ABSENT,
      look(other, "lk-done", b"\x01"))
s, _, _ = claim(app, "lk-done", fingerprint=b"\x01")
check("after completion: claim_key answers as look_key said (replay)", s == "replay", s)
check("after completion: a look Citus does not delegate answers replay",
      not_delegated_look(app, "lk-done") == "replay", not_delegated_look(app, "lk-done"))

# forget_key: only the caller's own key; a forget in an open transaction is seen by a look as
# what a claim would see now (the committed row), and refuses a second forget at once.
check("another role's forget_key of the key finds nothing (false) and leaves it",
      result_of(other, "SELECT idempotency.forget_key('lk-done')") == "False"
      and look(app, "lk-done").startswith("replay"), look(app, "lk-done"))
forgot = result_of(holder, "SELECT idempotency.forget_key('lk-done')")
seen = look(app, "lk-done")
second = result_of(app, "SELECT idempotency.forget_key('lk-done')")
holder.rollback()
check("a forget in an open transaction: look_key still answers replay, a second forget refuses at once (55000)",
      forgot == "True" and seen.startswith("replay") and second == "55000", (forgot, seen, second))
check("forget_key forgets a completed key", result_of(app, "SELECT idempotency.forget_key('lk-done')") == "True")
check("a forgotten key: look_key answers claimed", look(app, "lk-done") == ABSENT, look(app, "lk-done"))
s, _, attempts = claim(app, "lk-done", fingerprint=b"\x01")
check("a forgotten key: the next claim is claimed, attempt 1 (the operation runs again)",
      (s, attempts) == ("claimed", 1), (s, attempts))

_, token, _ = claim(app, "lk-live", lease="1 hour")
check("a live claim without its token: forget_key refuses (55000)",
      result_of(app, "SELECT idempotency.forget_key('lk-live')") == "55000")
check("a live claim with its token: forget_key forgets it",
      result_of(app, "SELECT idempotency.forget_key('lk-live', %s)", (token,)) == "True")
check("the holder's later complete_key gets P0002",
      result_of(app, "SELECT idempotency.complete_key('lk-live', %s, '{}')", (token,)) == "P0002")
check("forget_key of an absent key answers false", result_of(app, "SELECT idempotency.forget_key('lk-none')") == "False")
for sql in ("SELECT idempotency.look_key(NULL)", "SELECT idempotency.forget_key(NULL)"):
    check("NULL key: %s -> 22004" % sql, result_of(app, sql) == "22004")

# Counted on the nodes where the calls ran, when each call answers (as every counter of
# idempotency_stats: a claim that rolls back is counted too): lk-done twice (the forget that
# rolled back, then the one that stood) and lk-live.
forgotten = forgotten_on_workers() - forgotten_before
check("the workers' statistics count the three forgets that deleted a key (one of them rolled back)",
      forgotten == 3, forgotten)

# The limit of mixing the batch functions with delegated calls (docs/design.md, "Citus"): a
# batch in an open transaction takes its key locks on the coordinator, so the delegated look on
# the shard's node sees neither a row nor a lock, and answers what a claim would answer once the
# batch rolls back.
holder.execute("SELECT * FROM idempotency.claim_keys(ARRAY['lk-batch'])")
seen = look(app, "lk-batch")
holder.rollback()
check("limit: a key an open batch claims: the delegated look_key answers claimed (it never waits)",
      seen == ABSENT, seen)

check("the coordinator is still up", admin.execute("SELECT 1").fetchone()[0] == 1)
finish()
