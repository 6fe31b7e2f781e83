#!/usr/bin/python3
"""Hostile input for every SQL function of the extension (property / fuzz test).

  fuzz.py --workdir DIR [--port P] [--calls N] [--seed S]

Makes its own throw-away cluster in DIR (as the postgres user when run as root), then
throws random and boundary values at claim_key, complete_key, release_key,
checkpoint_key, request_fingerprint (jsonb, text, bytea), gen_uuid_v7, gen_uuid_v7(ts),
uuid_v7_time and idempotency_cleanup: NULLs, empty strings, 10 MB keys and scopes,
multibyte keys at the byte limit, zero / negative / huge intervals and intervals at the
limits (idempotency.max_ttl, idempotency.max_lease), fingerprints and recovery points at and
over their limits, timestamps outside every range, deeply nested jsonb, responses over
idempotency.max_response_size, wrong, stale and NULL tokens, the same keys claimed by
another role (a key is (role, scope, key): another role's key is another key), keys with
every character valid in UTF-8.

Oracle for every call: the expected outcome is computed from the arguments and the row as
it was before the call (a model of SPEC section 3): either the status / result the SPEC
prescribes, or an error with one of the SQLSTATEs the README documents for that input.
Intervals are judged as the server judges them: one span, a month counted as 30 days and
a day as 24 hours, whatever the calendar day.
After every failing call (and every answer that must not write: replay, mismatch,
in_progress) a digest of idempotency_keys must be unchanged. The server must never crash
(same postmaster start time throughout; no "terminated by signal" in its log).
Prints one "ok"/"not ok" line per property and ends with "N passed, N failed".
The random seed is fixed (DEFAULT_SEED) unless --seed gives another, and always printed.
"""

import argparse
import collections
import datetime
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import uuid

import psycopg
import psycopg.types.datetime

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from valgrind_support import VALGRIND, valgrind_checks, valgrind_opts  # noqa: E402



MAX_KEY = 255
MAX_RESPONSE = 1024 * 1024
MAX_FINGERPRINT = 64                  # idempotency.max_fingerprint_size
MAX_RECOVERY_POINT = 1024             # idempotency.max_recovery_point_size
US_PER_DAY = 86400 * 10**6
MAX_TTL_US = 30 * US_PER_DAY          # idempotency.max_ttl
MAX_LEASE_US = US_PER_DAY             # idempotency.max_lease
DEFAULT_TTL_US = US_PER_DAY           # idempotency.default_ttl
DEFAULT_LEASE_US = 5 * 60 * 10**6     # idempotency.default_lease
INT64_MAX = 2**63 - 1
# No verdict may depend on the day the test runs: the seed is fixed unless one is given.
DEFAULT_SEED = 20261201
UTC = datetime.timezone.utc
# The last millisecond a UUIDv7 can carry: 2^48 - 1 ms after the epoch.
V7_MAX = "10889-08-02 05:31:50.655+00"
V7_PAST_MAX = "10889-08-02 05:31:50.656+00"


class ClampingTimestamptzLoader(psycopg.types.datetime.TimestamptzLoader):
    """Timestamps beyond Python's year 9999 (expiries 100000 years ahead) load as the
    largest (or smallest) datetime: the oracle only compares them with now."""

    def load(self, data):
        try:
            return super().load(data)
        except psycopg.DataError:
            text = bytes(data).decode()
            if text.endswith("BC") or text.startswith("-"):
                return datetime.datetime.min.replace(tzinfo=UTC)
            return datetime.datetime.max.replace(tzinfo=UTC)


class Cluster:
    def __init__(self, workdir, port):
        self.workdir, self.port = workdir, port
        self.data = os.path.join(workdir, "data")
        self.log = os.path.join(workdir, "server.log")
        self.root = os.geteuid() == 0

    def pg(self, argv):
        if self.root:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        subprocess.run(argv, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.workdir)

    def start(self):
        if self.root:
            shutil.chown(self.workdir, "postgres")
        self.pg(["initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync"])
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("\n".join([
                "port = %d" % self.port, "listen_addresses = ''",
                "unix_socket_directories = '%s'" % self.workdir,
                "shared_preload_libraries = 'idempotency'",
                # The cleanup worker would delete expired rows between two digests.
                "idempotency.cleanup_interval = '24h'",
                "fsync = off", "log_min_messages = warning", "timezone = 'UTC'", ""]))
        self.pg(["pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60"] + valgrind_opts(self.workdir) + ["start"])

    def stop(self):
        try:
            self.pg(["pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop"])
        except subprocess.CalledProcessError:
            pass


# ------------------------------------------------------------------------------------
# Argument pools. Each value is (sql, params, model) where sql is an SQL expression with
# %s placeholders and model is what the oracle knows about it.
# ------------------------------------------------------------------------------------

def utf8_len(s):
    return len(s.encode("utf-8"))


def span(months=0, days=0, us=0):
    """An interval as the server judges it: one span of microseconds, a month of 30 days and
    a day of 24 hours; "range" when it does not fit 64 bits."""
    total = us + days * US_PER_DAY + months * 30 * US_PER_DAY
    return total if -INT64_MAX - 1 <= total <= INT64_MAX else "range"


class Pools:
    def __init__(self, rng):
        self.rng = rng
        big = "k" * (10 * 1024 * 1024)
        multi = "\u00e9" * 127 + "k"          # 255 bytes
        self.live_keys = ["k%d" % i for i in range(6)] + ["\u20ac-%d" % i for i in range(2)]
        self.foreign_keys = ["owned-by-other-0", "owned-by-other-1"]
        self.hostile_keys = [
            None, "", " ", "a" * MAX_KEY, "a" * (MAX_KEY + 1), multi, multi + "\u00e9",
            "\U0010ffff" * 63 + "abc", "\U0010ffff" * 64, big, "\u00e9" * (5 * 1024 * 1024),
            "quote'\"\\;--", "\t\n\r\x01\x7f", "\ufeffbom", "e\u0301", "\u00e9",
        ]
        self.scopes = ["", "", "", "s1", "s\u00e9", None, "x" * MAX_KEY, "x" * (MAX_KEY + 1), big]

    def key(self):
        r = self.rng.random()
        if r < 0.6:
            return self.rng.choice(self.live_keys)
        if r < 0.7:
            return self.rng.choice(self.foreign_keys)
        if r < 0.88:
            return "fresh-%d" % self.rng.randrange(1 << 40)
        return self.rng.choice(self.hostile_keys)

    def scope(self):
        r = self.rng.random()
        return self.rng.choice(["", "s1"]) if r < 0.92 else self.rng.choice(self.scopes)

    def fingerprint(self):
        # Random bytes come from the seeded generator: a run is replayed by its seed.
        rb = lambda n: bytes(self.rng.getrandbits(8) for _ in range(n))
        return self.rng.choice([None, None, None, b"", b"\x00", bytes(32), b"fp-a", b"fp-a", b"fp-b",
                                rb(32), rb(MAX_FINGERPRINT), rb(MAX_FINGERPRINT + 1),
                                self.rng.randbytes(1024 * 1024)])

    # Intervals as text for ::interval, with the oracle's view: None (NULL), or the span in
    # microseconds (a month is 30 days, a day 24 hours, as PostgreSQL compares intervals;
    # "range" when the span does not fit 64 bits).
    # NULL and positive spans (within or over a limit: see interval()).
    VALID_INTERVALS = [(None, None), ("1 microsecond", span(us=1)), ("50 milliseconds", span(us=50000)),
                       ("2 seconds", span(us=2 * 10**6)), ("1 hour", span(us=3600 * 10**6)),
                       ("1 hour", span(us=3600 * 10**6)), ("1 day", span(days=1)), ("24:00:00", span(days=1)),
                       ("1 day 1 microsecond", span(days=1, us=1)), ("25 hours", span(us=25 * 3600 * 10**6)),
                       ("30 days", span(days=30)), ("1 mon", span(months=1)),
                       ("1 mon 1 microsecond", span(months=1, us=1)),
                       ("29 days 25 hours", span(days=29, us=25 * 3600 * 10**6)),
                       ("100000 years", span(months=1200000)), ("2562047788 hours", span(us=2562047788 * 3600 * 10**6))]
    # Zero, negative, and beyond 64 bits.
    INTERVALS = [
        ("0", 0), ("-1 second", span(us=-10**6)), ("-5 minutes", span(us=-300 * 10**6)),
        ("1 day -86400 seconds", span(days=1, us=-86400 * 10**6)),
        ("1 mon -31 days", span(months=1, days=-31)), ("1 mon -30 days", span(months=1, days=-30)),
        ("-100000 years", span(months=-1200000)),
        ("177999999 years", span(months=177999999 * 12)), ("-177999999 years", span(months=-177999999 * 12)),
        ("2147483647 days", span(days=2147483647)), ("-2147483648 days", span(days=-2147483648)),
    ]

    def interval(self, limit):
        """A ttl or lease: mostly one within `limit`, sometimes one over it, sometimes a bad
        or boundary one."""
        r = self.rng.random()
        if r < 0.15:
            return self.rng.choice(self.INTERVALS)
        over = r < 0.2
        return self.rng.choice([iv for iv in self.VALID_INTERVALS
                                if (iv[0] is not None and iv[1] > limit) == over])

    def wait(self):
        # Waits stay short: a claim may wait on a key held by a lease.
        if self.rng.random() < 0.8:
            return self.rng.choice([(None, None), ("0", 0), ("10 milliseconds", span(us=10000)),
                                    ("1 mon -30 days 10 milliseconds", span(months=1, days=-30, us=10000))])
        return self.rng.choice([("-1 second", span(us=-10**6)), ("-177999999 years", span(months=-177999999 * 12)),
                                ("1 mon -31 days", span(months=1, days=-31)),
                                ("-1 day 86399 seconds", span(days=-1, us=86399 * 10**6))])

    def response(self):
        r = self.rng.random()
        if r < 0.5:
            return ("%s::jsonb", [json.dumps({"ok": self.rng.randrange(3)})], "small")
        return self.rng.choice([
            ("%s::jsonb", [None], "null"),
            ("%s::jsonb", ["null"], "small"),
            ("%s::jsonb", ["[]"], "small"),
            ("%s::jsonb", ['"' + "\u00e9" * 300 + '"'], "small"),
            ("fuzz_deep(%s)", [3000], "small"),           # 3000 levels of arrays and objects
            ("%s::jsonb", ['"' + "x" * (MAX_RESPONSE + 10) + '"'], "large"),
            ("%s::jsonb", [json.dumps(["y" * 1000] * 1200)], "large"),
        ])

    def response_code(self):
        return self.rng.choice([None, 200, 0, -1, 2147483647, -2147483648, 409])


# ------------------------------------------------------------------------------------
# The harness
# ------------------------------------------------------------------------------------

class Fuzz:
    def __init__(self, args, cluster):
        self.args = args
        self.cluster = cluster
        self.rng = random.Random(args.seed)
        self.pools = Pools(self.rng)
        self.results = collections.OrderedDict()
        self.failures = collections.defaultdict(list)
        self.counts = collections.Counter()
        self.tokens = []        # (owner, scope, key, token) seen (valid for some key at some time)

    def prop(self, name, ok, detail=""):
        self.counts[name] += 1
        if name not in self.results:
            self.results[name] = True
        if not ok:
            self.results[name] = False
            if len(self.failures[name]) < 8:
                self.failures[name].append(detail)

    def connect(self, user):
        dsn = "host=%s port=%d dbname=fuzz user=%s" % (self.workdir, self.args.port, user)
        c = psycopg.connect(dsn, autocommit=True)
        c.adapters.register_loader("timestamptz", ClampingTimestamptzLoader)
        c.execute("SET statement_timeout = '%s'" % ("300s" if VALGRIND else "20s"))
        return c

    def setup(self):
        self.workdir = os.path.abspath(self.args.workdir)
        with psycopg.connect("host=%s port=%d dbname=postgres user=postgres" % (self.workdir, self.args.port),
                             autocommit=True) as c:
            c.execute("CREATE DATABASE fuzz")
        admin = self.connect("postgres")
        admin.execute("CREATE EXTENSION idempotency")
        admin.execute("CREATE ROLE fuzz_app LOGIN")
        admin.execute("CREATE ROLE fuzz_other LOGIN")
        # What an application role needs (README); the SQL below calls the functions
        # unqualified, through the database's search_path.
        admin.execute("GRANT USAGE ON SCHEMA idempotency TO fuzz_app, fuzz_other")
        admin.execute("""ALTER DATABASE fuzz SET search_path = "$user", public, idempotency""")
        admin.close()
        admin = self.connect("postgres")
        # Deep jsonb built without the recursive-descent parser (which stops at
        # max_stack_depth on its own): arbitrarily deep documents reach our functions.
        admin.execute("""
          CREATE FUNCTION fuzz_deep(depth int) RETURNS jsonb LANGUAGE plpgsql AS $$
          DECLARE j jsonb := '"leaf"';
          BEGIN
            FOR i IN 1..depth LOOP
              j := CASE WHEN i % 2 = 0 THEN jsonb_build_array(j) ELSE jsonb_build_object('k', j) END;
            END LOOP;
            RETURN j;
          END $$""")
        self.admin = admin
        self.app = self.connect("fuzz_app")
        self.other = self.connect("fuzz_other")
        self.app_oid = admin.execute("SELECT 'fuzz_app'::regrole::oid").fetchone()[0]
        self.other_oid = admin.execute("SELECT 'fuzz_other'::regrole::oid").fetchone()[0]
        # Keys that the other role holds (a live lease) and has completed: to the application
        # role they are keys it does not have.
        for k in self.pools.foreign_keys:
            for scope in ("", "s1"):
                t = self.other.execute("SELECT token FROM claim_key(%s, NULL, %s, '1 day', '1 day')",
                                       (k, scope)).fetchone()[0]
                self.tokens.append((self.other_oid, scope, k, t))
                if k.endswith("1"):
                    self.other.execute("SELECT complete_key(%s, %s, '{\"of\": \"other\"}', 200, %s)", (k, t, scope))
        self.start_time = admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0]

    # -------------------------------------------------------------- state helpers

    def digest(self):
        # Every insert, update or delete makes a row version with a new (ctid, xmin): the
        # set of them is unchanged exactly when no row changed.
        return self.admin.execute(
            "SELECT count(*) || ':' || coalesce(md5(string_agg(ctid::text || xmin::text, ',' ORDER BY ctid)), '')"
            " FROM idempotency_keys").fetchone()[0]

    def row(self, owner, scope, key):
        """The row of the key (owner, scope, key): a key is the role's own."""
        if key is None or scope is None or utf8_len(key) > MAX_KEY or utf8_len(scope) > MAX_KEY:
            return None
        r = self.admin.execute(
            "SELECT (SELECT r.oid FROM pg_roles r WHERE r.rolname = owner), fingerprint, status::text,"
            " md5(response::text), response_code, recovery_point, lease_token,"
            " locked_until, attempts, expires_at, clock_timestamp(), ttl, lease FROM idempotency_keys"
            " WHERE owner = (SELECT r.rolname::text FROM pg_roles r WHERE r.oid = %s::oid)"
            " AND scope = %s AND key = %s", (owner, scope, key)).fetchone()
        if r is None:
            return None
        names = ("owner", "fingerprint", "status", "response", "response_code", "recovery_point",
                 "lease_token", "locked_until", "attempts", "expires_at", "clock", "ttl", "lease")
        return dict(zip(names, r))

    def server_now(self):
        return self.admin.execute("SELECT clock_timestamp()").fetchone()[0]

    def call(self, conn, query, params):
        try:
            cur = conn.execute(query, params)
            return ("ok", cur.fetchall())
        except psycopg.Error as e:
            return ("error", e.sqlstate or "?", str(e).splitlines()[0] if str(e) else "")

    # -------------------------------------------------------------- common validation

    @staticmethod
    def key_errors(key, scope):
        """SQLSTATEs that the key / scope arguments alone call for (any order is fine)."""
        errs = set()
        if key is None or scope is None:
            errs.add("22004")
        if key == "":
            errs.add("22023")
        if key is not None and utf8_len(key) > MAX_KEY:
            errs.add("22001")
        if scope is not None and utf8_len(scope) > MAX_KEY:
            errs.add("22001")
        return errs

    @staticmethod
    def interval_errors(iv, limit=None, zero_ok=False):
        """SQLSTATEs for a ttl / lease (positive, at most `limit` us) or a wait (zero_ok: not
        negative, no limit), judged as one span (a month of 30 days)."""
        text, us = iv
        if text is None:
            return set()
        if us == "range" or us < 0 or (us == 0 and not zero_ok) or (limit is not None and us > limit):
            return {"22023"}
        return set()

    @staticmethod
    def size_errors(value, limit):
        """22001 for a fingerprint or recovery point of more than `limit` bytes."""
        if value is None:
            return set()
        n = len(value) if isinstance(value, (bytes, bytearray)) else utf8_len(value)
        return {"22001"} if n > limit else set()

    def check_outcome(self, fn, res, errs, before, after_digest, desc):
        """Common part: an expected error set must produce one of those errors, and a
        failure must change nothing."""
        if res[0] == "error":
            self.prop(fn + ": failures change no row", after_digest == before, desc + " -> " + res[1])
            if res[1] in ("XX000", "58000", "XX001", "?"):
                self.prop(fn + ": never an internal error", False, "%s -> %s %s" % (desc, res[1], res[2]))
        if errs:
            self.prop(fn + ": invalid arguments get a documented SQLSTATE",
                      res[0] == "error" and res[1] in errs,
                      "%s -> expected %s, got %s" % (desc, sorted(errs), res[1:] if res[0] == "error" else "success"))
            return False
        return True

    # -------------------------------------------------------------- claim_key

    def fuzz_claim(self):
        key, scope = self.pools.key(), self.pools.scope()
        fp = self.pools.fingerprint()
        ttl, lease, wait = self.pools.interval(MAX_TTL_US), self.pools.interval(MAX_LEASE_US), self.pools.wait()
        as_other = self.rng.random() < 0.05
        caller = self.other_oid if as_other else self.app_oid
        # Every SQLSTATE some argument calls for: the SPEC fixes no order of the checks.
        errs = (self.key_errors(key, scope) | self.interval_errors(ttl, MAX_TTL_US)
                | self.interval_errors(lease, MAX_LEASE_US) | self.interval_errors(wait, zero_ok=True)
                | self.size_errors(fp, MAX_FINGERPRINT))
        desc = "claim_key(%s, fp %s, scope %s, ttl %s, lease %s, wait %s)%s" % (
            short(key), short(fp), short(scope), ttl[0], lease[0], wait[0], " as other" if as_other else "")
        row = self.row(caller, scope if scope is not None else "", key if key is not None else "")
        before = self.digest()
        t0 = self.server_now()
        res = self.call(self.other if as_other else self.app,
                        "SELECT r.status::text, r.token, md5(r.response::text), r.response_code, r.fingerprint,"
                        " r.recovery_point, r.attempts, r.retry_after FROM claim_key(%s::text, %s::bytea, %s::text,"
                        " %s::interval, %s::interval, %s::interval) r",
                        (key, fp, scope, ttl[0], lease[0], wait[0]))
        t1 = self.server_now()
        after = self.digest()
        if not self.check_outcome("claim_key", res, errs, before, after, desc):
            return
        expected = self.expect_claim(row, fp, t0, t1, wait)
        if res[0] == "error":
            self.prop("claim_key: valid arguments follow the SPEC status table", res[1] in expected,
                      "%s -> %s %s (expected %s)" % (desc, res[1], res[2], sorted(expected)))
            return
        status, token, response, code, rfp, rp, attempts, retry = res[1][0]
        self.prop("claim_key: valid arguments follow the SPEC status table", status in expected,
                  "%s -> %s (expected %s; row %s)" % (desc, status, sorted(expected), brief(row)))
        new = self.row(caller, scope, key)
        if status in ("replay", "mismatch", "in_progress"):
            self.prop("claim_key: replay / mismatch / in_progress write nothing", after == before, desc)
            self.prop("claim_key: no token unless claimed", token is None, desc)
        if status == "replay":
            self.prop("claim_key: replay returns the stored response",
                      row is not None and response == row["response"] and code == row["response_code"], desc)
        if status == "mismatch":
            self.prop("claim_key: mismatch reveals no response", response is None and code is None, desc)
        if status == "in_progress":
            self.prop("claim_key: in_progress has retry_after > 0",
                      retry is not None and retry > datetime.timedelta(0), desc)
        if status in ("claimed", "reclaimed"):
            ok = (token is not None and new is not None and new["status"] == "processing"
                  and new["lease_token"] == token and new["owner"] == caller
                  and new["attempts"] == attempts
                  and (attempts == 1 if status == "claimed" else attempts == row["attempts"] + 1))
            if status == "reclaimed":
                ok = ok and new["recovery_point"] == row["recovery_point"]
            self.prop("claim_key: a claim stores the holder's token, owner and attempts", ok,
                      "%s -> %s, row %s" % (desc, status, brief(new)))
            want_ttl = datetime.timedelta(microseconds=DEFAULT_TTL_US if ttl[0] is None else ttl[1])
            want_lease = datetime.timedelta(microseconds=DEFAULT_LEASE_US if lease[0] is None else lease[1])
            # expires_at = now + ttl, locked_until = now + lease, and a processing key never
            # expires while its lease runs: one span each, whatever the calendar says a month is.
            self.prop("claim_key: a claim stores its ttl and lease, each as one span",
                      new is not None and new["ttl"] == want_ttl and new["lease"] == want_lease
                      and new["expires_at"] - new["locked_until"] == max(want_ttl - want_lease, datetime.timedelta(0)),
                      "%s -> ttl %s lease %s expires %s locked until %s" % (
                          desc, new and new["ttl"], new and new["lease"], new and new["expires_at"],
                          new and new["locked_until"]))
            if token is not None:
                self.tokens.append((caller, scope, key, token))

    def expect_claim(self, row, fp, t0, t1, wait):
        """Statuses (or SQLSTATEs) the SPEC allows, given the caller's own row read just
        before (another role's row of the same scope and key is another key: never here)."""
        slack = datetime.timedelta(milliseconds=100)
        lo, hi = t0 - slack, t1 + slack
        if wait[0] is not None and wait[1] > 0:
            hi += datetime.timedelta(microseconds=wait[1])
        out = set()
        if row is None:
            return {"claimed"}
        exp = row["expires_at"]
        expired_options = []
        if exp <= lo:
            expired_options = [True]
        elif exp > hi:
            expired_options = [False]
        else:
            expired_options = [True, False]
        for expired in expired_options:
            if expired:
                out.add("claimed")
                continue
            if fp is not None and row["fingerprint"] is not None and bytes(fp) != bytes(row["fingerprint"]):
                out.add("mismatch")
                continue
            if row["status"] == "completed":
                out.add("replay")
                continue
            lu = row["locked_until"]
            if row["lease_token"] is None or lu is None or lu <= lo:
                out.add("reclaimed")
            elif lu > hi:
                out.add("in_progress")
            else:
                out.update({"in_progress", "reclaimed"})
        return out

    # -------------------------------------------------------------- fenced functions

    def token(self, owner, scope, key):
        r = self.rng.random()
        mine = [t for o, s, k, t in self.tokens if o == owner and s == scope and k == key]
        theirs = [t for o, s, k, t in self.tokens if o != owner and s == scope and k == key]
        if r < 0.45 and mine:
            return mine[-1]          # the newest token of this key
        if r < 0.6 and mine:
            return self.rng.choice(mine)  # possibly stale
        if r < 0.65 and theirs:
            return self.rng.choice(theirs)  # the same (scope, key) of the other role: another key's
        if r < 0.7 and self.tokens:
            return self.rng.choice(self.tokens)[3]  # another key's
        return self.rng.choice([None, uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1),
                                uuid.UUID(int=self.rng.getrandbits(128), version=4),
                                uuid.UUID("01890000-0000-7000-8000-000000000000")])

    def fenced_expectation(self, row, token, now_lo, now_hi):
        """What complete / release / checkpoint may do with the caller's own row: 'hold'
        (token holds the key), 'completed-same' (completed with this token) or an error set.
        Another role's row is never consulted: without one of its own the caller gets P0002."""
        if row is None:
            return {"P0002"}
        options = set()
        exp = row["expires_at"]
        for expired in ([True] if exp <= now_lo else [False] if exp > now_hi else [True, False]):
            if expired:
                options.add("P0002")
            elif row["status"] == "completed":
                options.add("completed-same" if row["lease_token"] == token else "55000")
            elif row["lease_token"] is not None and row["lease_token"] == token:
                options.add("hold")
            else:
                options.add("55000")
        return options

    def fuzz_fenced(self, fn):
        key, scope = self.pools.key(), self.pools.scope()
        as_other = self.rng.random() < 0.1
        caller = self.other_oid if as_other else self.app_oid
        if self.rng.random() < 0.6 and self.tokens:
            _, scope, key, _ = self.rng.choice(self.tokens)
        token = self.token(caller, scope, key)
        errs = self.key_errors(key, scope)
        if token is None:
            errs.add("22004")
        params = [key, token]
        extra = ""
        if fn == "complete_key":
            resp_sql, resp_params, resp_kind = self.pools.response()
            code = self.pools.response_code()
            if resp_kind == "large":
                errs.add("54000")
            query = ("SELECT r.status::text, md5(r.response::text), r.response_code FROM complete_key(%%s::text, %%s::uuid, %s,"
                     " %%s::int, %%s::text) r" % resp_sql)
            params = [key, token] + resp_params + [code, scope]
            extra = " response %s code %s" % (resp_kind, code)
        elif fn == "release_key":
            query = "SELECT release_key(%s::text, %s::uuid, %s::text)"
            params = [key, token, scope]
        else:
            rp = self.rng.choice([None, "", "step-1", "step-1", "charged", "charged", "x" * MAX_RECOVERY_POINT,
                                  "\u00e9" * (MAX_RECOVERY_POINT // 2)] if self.rng.random() < 0.8 else
                                 ["\u00e9" * (MAX_RECOVERY_POINT // 2 + 1), "x" * (MAX_RECOVERY_POINT + 1),
                                  "\u00e9" * 1000, "x" * 100000])
            lease = self.pools.interval(MAX_LEASE_US)
            errs |= self.interval_errors(lease, MAX_LEASE_US) | self.size_errors(rp, MAX_RECOVERY_POINT)
            query = "SELECT checkpoint_key(%s::text, %s::uuid, %s::text, %s::text, %s::interval)"
            params = [key, token, rp, scope, lease[0]]
            extra = " rp %s lease %s" % (short(rp), lease[0])
        desc = "%s(%s, token %s, scope %s)%s%s" % (fn, short(key), str(token)[:13], short(scope), extra,
                                                   " as other" if as_other else "")
        row = self.row(caller, scope if scope is not None else "", key if key is not None else "")
        before = self.digest()
        t0 = self.server_now()
        res = self.call(self.other if as_other else self.app, query, params)
        t1 = self.server_now()
        after = self.digest()
        if not self.check_outcome(fn, res, errs, before, after, desc):
            return
        slack = datetime.timedelta(milliseconds=100)
        expected = self.fenced_expectation(row, token, t0 - slack, t1 + slack)
        new = self.row(caller, scope, key)
        if res[0] == "error":
            allowed = {e for e in expected if e[0].isdigit() or e[0] == "P"}
            if fn == "complete_key" and "completed-same" in expected:
                allowed.add("55000")   # completed with this token, but another response
            if fn != "complete_key" and "completed-same" in expected:
                allowed.add("55000")   # release / checkpoint of a completed key
            self.prop(fn + ": fenced by the token as the SPEC says", res[1] in allowed,
                      "%s -> %s %s (expected %s; row %s)" % (desc, res[1], res[2], sorted(expected), brief(row)))
            return
        ok_states = {"hold"} | ({"completed-same"} if fn == "complete_key" else set())
        self.prop(fn + ": fenced by the token as the SPEC says", bool(expected & ok_states),
                  "%s -> success (expected %s; row %s)" % (desc, sorted(expected), brief(row)))
        if fn == "complete_key":
            if row is not None and row["status"] == "completed":
                self.prop("complete_key: completing again is a no-op", before == after, desc)
            else:
                self.prop("complete_key: stores the response and completes",
                          new is not None and new["status"] == "completed" and new["lease_token"] == token,
                          "%s -> row %s" % (desc, brief(new)))
        elif fn == "release_key":
            self.prop("release_key: drops the lease", new is not None and new["lease_token"] is None
                      and new["status"] == "processing", desc)
        else:
            self.prop("checkpoint_key: stores the recovery point",
                      new is not None and new["recovery_point"] == params[2] and new["lease_token"] == token, desc)
            # A NULL lease renews by the lease the claim was made with (the row's), not by
            # idempotency.default_lease.
            until = res[1][0][0]
            lease_of = row["lease"] if lease[0] is None else datetime.timedelta(microseconds=lease[1])
            self.prop("checkpoint_key: renews by the lease given, or else by the claim's own",
                      new is not None and new["locked_until"] == until
                      and t0 - slack + lease_of <= until <= t1 + slack + lease_of,
                      "%s -> until %s, between %s and %s + %s" % (desc, until, t0, t1, lease_of))

    # -------------------------------------------------------------- helpers' properties

    def fuzz_helpers(self):
        c = self.app
        # gen_uuid_v7(ts): boundaries and the round trip through uuid_v7_time.
        cases = ["1970-01-01 00:00:00+00", "1969-12-31 23:59:59.999999+00", "infinity", "-infinity",
                 "4713-01-01 00:00:00+00 BC", "294276-12-31 23:59:59+00", "2026-06-01 12:34:56.789123+02",
                 V7_MAX, V7_PAST_MAX, "10889-08-02 05:31:50.655999+00", None]
        for ts in cases:
            before = self.digest()
            res = self.call(c, "SELECT gen_uuid_v7(%s::timestamptz), uuid_v7_time(gen_uuid_v7(%s::timestamptz))::text,"
                               " date_trunc('milliseconds', %s::timestamptz)::text", (ts, ts, ts))
            if ts is None:
                self.prop("gen_uuid_v7(ts): NULL in, NULL out", res[0] == "ok" and res[1][0][0] is None, str(res))
                continue
            if ts in ("infinity", "-infinity"):
                inside = False
            else:
                t = self.admin.execute("SELECT %s::timestamptz >= '1970-01-01 00:00:00+00' AND"
                                       " date_trunc('milliseconds', %s::timestamptz) <= %s::timestamptz",
                                       (ts, ts, V7_MAX)).fetchone()[0]
                inside = t
            if inside:
                ok = res[0] == "ok" and res[1][0][0].version == 7 and res[1][0][1] == res[1][0][2]
                self.prop("gen_uuid_v7(ts): inside 1970..10889 gives a v7 UUID carrying ts (ms)", ok, "%s -> %s" % (ts, res))
            else:
                self.prop("gen_uuid_v7(ts): outside the range fails with 22008",
                          res[0] == "error" and res[1] == "22008", "%s -> %s" % (ts, res))
            self.prop("helpers write nothing", self.digest() == before, str(ts))
        # uuid_v7_time of other versions and odd values.
        for u, v7 in [(uuid.UUID(int=self.rng.getrandbits(128), version=4), False), (uuid.UUID(int=0), False), (uuid.UUID(int=(1 << 128) - 1), False),
                      (uuid.uuid1(), False), (None, False)]:
            res = self.call(c, "SELECT uuid_v7_time(%s::uuid)", (u,))
            self.prop("uuid_v7_time: NULL for non-v7 UUIDs and NULL", res[0] == "ok" and res[1][0][0] is None,
                      "%s -> %s" % (u, res))
        res = self.call(c, "SELECT count(DISTINCT u), bool_and(uuid_v7_time(u) IS NOT NULL) FROM"
                           " (SELECT gen_uuid_v7() u FROM generate_series(1, 10000)) s", ())
        self.prop("gen_uuid_v7(): 10000 distinct v7 values", res[0] == "ok" and res[1][0] == (10000, True), str(res))
        # request_fingerprint: NULL, empty, huge, deep; equal jsonb <=> equal fingerprint.
        for expr, params in [("request_fingerprint(%s::jsonb)", [None]), ("request_fingerprint(%s::text)", [None]),
                             ("request_fingerprint(%s::bytea)", [None])]:
            res = self.call(c, "SELECT " + expr, params)
            self.prop("request_fingerprint: NULL in, NULL out", res[0] == "ok" and res[1][0][0] is None, expr)
        for expr, params in [("request_fingerprint(%s::text)", [""]), ("request_fingerprint(%s::bytea)", [b""]),
                             ("request_fingerprint(%s::text)", ["\u00e9" * (5 * 1024 * 1024)]),
                             ("request_fingerprint(%s::bytea)", [self.rng.randbytes(10 * 1024 * 1024)]),
                             ("request_fingerprint(fuzz_deep(%s))", [6000]),
                             ("request_fingerprint(%s::jsonb)", ['""']), ("request_fingerprint(%s::jsonb)", ["{}"])]:
            res = self.call(c, "SELECT length(" + expr + ")", params)
            self.prop("request_fingerprint: any input gives 32 bytes", res[0] == "ok" and res[1][0][0] == 32,
                      "%s %s -> %s" % (expr, short(params[0]), res))
        for _ in range(200):
            a = random_json(self.rng, 4)
            b = a if self.rng.random() < 0.5 else random_json(self.rng, 4)
            ta, tb = dumps_shuffled(self.rng, a), dumps_shuffled(self.rng, b)
            res = self.call(c, "SELECT request_fingerprint(%s::jsonb) = request_fingerprint(%s::jsonb),"
                               " %s::jsonb = %s::jsonb", (ta, tb, ta, tb))
            self.prop("request_fingerprint: equal jsonb <=> equal fingerprint (any key order, spacing, 1.0 vs 1.00)",
                      res[0] == "ok" and res[1][0][0] == res[1][0][1], "%s vs %s -> %s" % (ta[:80], tb[:80], res))
        for a, b in [('[1]', '"[1]"'), ('{"a":"b"}', '["a","b"]'), ('"ab"', '["a","b"]'), ('{"a":{}}', '{"a":[]}'),
                     ('[[1],2]', '[1,[2]]'), ('{"ab":"c"}', '{"a":"bc"}'), ('1', '[1]'), ('null', '"null"'),
                     ('true', '"true"'), ('{"a":1,"b":2}', '{"a":2,"b":1}')]:
            res = self.call(c, "SELECT request_fingerprint(%s::jsonb) <> request_fingerprint(%s::jsonb)", (a, b))
            self.prop("request_fingerprint: different jsonb values differ", res[0] == "ok" and res[1][0][0], a + " vs " + b)
        # idempotency_cleanup: admin only; batch size must be positive.
        res = self.call(c, "SELECT idempotency_cleanup(10)", ())
        self.prop("idempotency_cleanup: refused to applications (42501)", res[0] == "error" and res[1] == "42501", str(res))
        for b in (None, 0, -1, -2147483648, 1, 2147483647):
            before = self.digest()
            res = self.call(self.admin, "SELECT idempotency_cleanup(%s::int)", (b,))
            if b is not None and b <= 0:
                self.prop("idempotency_cleanup: non-positive batch size fails with 22023 and deletes nothing",
                          res[0] == "error" and res[1] == "22023" and self.digest() == before, "%s -> %s" % (b, res))
            else:
                self.prop("idempotency_cleanup: any positive batch size works", res[0] == "ok" and res[1][0][0] >= 0,
                          "%s -> %s" % (b, res))

    # -------------------------------------------------------------- every UTF-8 character

    def utf8_keys(self):
        """Keys made of every Unicode scalar value (U+0001..U+10FFFF minus surrogates), so
        every byte that valid UTF-8 can contain appears in some key: each is claimed,
        completed, replayed and stored byte for byte."""
        chars = [chr(cp) for cp in range(1, 0x110000) if not 0xD800 <= cp <= 0xDFFF]
        keys, cur, size = [], [], 0
        for ch in chars:
            n = utf8_len(ch)
            if size + n > MAX_KEY:
                keys.append("".join(cur))
                cur, size = [], 0
            cur.append(ch)
            size += n
        keys.append("".join(cur))
        c = self.app
        t = time.time()
        ok = True
        # Batches of 500: a transaction keeps a lock per claimed key until it ends.
        for i in range(0, len(keys), 500):
            batch = keys[i:i + 500]
            r = self.call(c, "SELECT count(*) FILTER (WHERE (c).status = 'claimed'),"
                             " count(*) FILTER (WHERE (complete_key(k, (c).token, to_jsonb(k), NULL, 'utf8')).status = 'replay')"
                             " FROM (SELECT k, claim_key(k, NULL, 'utf8') c FROM unnest(%s::text[]) k) s", (batch,))
            ok = ok and r[0] == "ok" and r[1][0] == (len(batch), len(batch))
            if not ok:
                self.prop("every valid UTF-8 character: claimed and completed", False, str(r)[:300])
                return
        self.prop("every valid UTF-8 character: claimed and completed", True)
        r = self.admin.execute("SELECT count(*), sum(octet_length(key)) FROM idempotency_keys WHERE scope = 'utf8'").fetchone()
        self.prop("every valid UTF-8 character: every key stored byte for byte",
                  r == (len(keys), sum(utf8_len(k) for k in keys)), "%s vs %d keys" % (r, len(keys)))
        mism = 0
        for i in range(0, len(keys), 500):
            batch = keys[i:i + 500]
            r = c.execute("SELECT count(*) FROM (SELECT k, claim_key(k, NULL, 'utf8') c FROM unnest(%s::text[]) k) s"
                          " WHERE (c).status <> 'replay' OR (c).response <> to_jsonb(k)", (batch,)).fetchone()[0]
            mism += r
        self.prop("every valid UTF-8 character: duplicates replay their own response", mism == 0, "%d wrong" % mism)
        self.counts["utf8 keys"] = len(keys)
        self.admin.execute("DELETE FROM idempotency_keys WHERE scope = 'utf8'")
        print("# %d keys covering %d characters in %.1f s" % (len(keys), len(chars), time.time() - t), flush=True)

    # -------------------------------------------------------------- main

    def run(self):
        self.setup()
        t = time.time()
        n = 0
        fns = ["claim"] * 5 + ["complete_key"] * 3 + ["release_key", "checkpoint_key"]
        while n < self.args.calls:
            fn = self.rng.choice(fns)
            if fn == "claim":
                self.fuzz_claim()
            else:
                self.fuzz_fenced(fn)
            n += 1
            if n % 500 == 0:
                alive = self.admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
                self.prop("the server never restarts", alive == self.start_time, "after %d calls" % n)
        print("# %d random calls in %.1f s" % (n, time.time() - t), flush=True)
        self.fuzz_helpers()
        self.utf8_keys()
        alive = self.admin.execute("SELECT pg_postmaster_start_time()").fetchone()[0]
        self.prop("the server never restarts", alive == self.start_time, "at the end")


def short(v):
    if v is None:
        return "NULL"
    if isinstance(v, (bytes, bytearray)):
        return "bytea[%d]" % len(v)
    s = str(v)
    return repr(s) if len(s) <= 24 else "%r..[%d chars]" % (s[:12], len(s))


def brief(row):
    if row is None:
        return "none"
    return "%s attempts %s lease %s until %s expires %s rp %s" % (
        row["status"], row["attempts"], str(row["lease_token"])[:13], row["locked_until"], row["expires_at"],
        short(row["recovery_point"]))


def random_json(rng, depth):
    r = rng.random()
    if depth == 0 or r < 0.35:
        return rng.choice([None, True, False, 0, 1, -1, 1.5, "1.0", "", "a", "\u00e9\u20ac",
                           rng.randrange(-10**12, 10**12), {"$num": "one"}, {"$num": "zero"}])
    if r < 0.65:
        return [random_json(rng, depth - 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["a", "b", "c", "\u00e9", ""]): random_json(rng, depth - 1) for _ in range(rng.randrange(4))}


def dumps_shuffled(rng, v):
    """JSON text of v with random key order and spacing; {"$num": s} is the number s as written."""
    sp = lambda: rng.choice(["", " ", "\n  "])
    if isinstance(v, dict):
        if set(v) == {"$num"}:
            # The same number written differently each time.
            return rng.choice({"one": ["1", "1.0", "1.00", "100e-2", "0.1E1"],
                               "zero": ["0", "-0", "0.0", "0e5"]}[v["$num"]])
        items = list(v.items())
        rng.shuffle(items)
        return "{" + sp() + ("," + sp()).join(json.dumps(k) + sp() + ":" + sp() + dumps_shuffled(rng, x)
                                             for k, x in items) + sp() + "}"
    if isinstance(v, list):
        return "[" + sp() + ("," + sp()).join(dumps_shuffled(rng, x) for x in v) + sp() + "]"
    return json.dumps(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--port", type=int, default=5477)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED,
                    help="random seed (default %d: the same run every day)" % DEFAULT_SEED)
    args = ap.parse_args()
    print("# seed %d (replay with --seed %d, or IDEM_FUZZ_SEED=%d bash test/suites/fuzz.sh)"
          % (args.seed, args.seed, args.seed), flush=True)
    os.makedirs(args.workdir, exist_ok=True)
    cluster = Cluster(os.path.abspath(args.workdir), args.port)
    cluster.start()
    fz = Fuzz(args, cluster)
    try:
        fz.run()
    except Exception as e:  # a harness error is a failure, never a pass
        fz.prop("the harness ran to the end", False, repr(e))
    finally:
        cluster.stop()
    with open(cluster.log, errors="replace") as fh:
        bad = [l for l in fh if "terminated by signal" in l or "PANIC" in l or "server process" in l and "exited" in l]
    fz.prop("server log: no backend terminated by a signal", not bad, bad[0].strip() if bad else "")
    valgrind_checks(lambda ok, what: fz.prop(what.split("\n")[0].split(" (")[0], ok, what), cluster.workdir)
    print("# seed %d; calls per property: %s" % (args.seed, dict(fz.counts)))
    passed = failed = 0
    for name, ok in fz.results.items():
        print("%s - %s (%d checks)" % ("ok" if ok else "not ok", name, fz.counts[name]))
        for d in fz.failures[name]:
            print("#     " + d)
        passed += ok
        failed += not ok
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
