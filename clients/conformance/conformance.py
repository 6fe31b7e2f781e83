#!/usr/bin/python3
"""The language-neutral conformance client of the HTTP packages (clients/conformance/CONTRACT.md).

    conformance.py --name go --port 5501 --database-url DSN [--seed N] [--modes inbox,two_phase]
                   -- COMMAND [ARG...]

COMMAND is the app (clients/go/cmd/conformance-app, clients/python/conformance_app.py flask, ...).
This script owns the app's process: it starts COMMAND in a process group of its own with the
contract's environment (DATABASE_URL, LISTEN, IDEM_MODE, ...), polls GET /healthz, sends the
requests of every case, kills the group with SIGKILL for the kill case and starts it again, and
stops it at the end. It counts rows in `payments` through DATABASE_URL (psycopg 3, the role app).

The database must hold the contract's set-up (the extension, USAGE on its schema for app, the
table payments owned by app); test/suites/conformance.sh makes a fresh one per app. Keys are
made from the seed and the rows already in payments, so a second run against the same database
does not meet the first run's keys.

Runs, each with the app started afresh: inbox (every case), two_phase (every case, the kill case
with the lease), inbox with IDEM_STORE_ERRORS=1 (5xx and exceptions stored), inbox with
IDEM_WAIT_MS (a duplicate in flight waits and replays). Prints "ok - ..." / "not ok - ..." per
assertion and ends with "conformance-NAME: N passed, M failed". Verdicts are counts and bytes,
never durations: where the suite must know that a request is in flight it asks (a duplicate
answered 409, or pg_stat_activity), and waits for a lease by the answers' Retry-After.
"""
import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid

import psycopg

# Headers a replay need not repeat (hop-by-hop, and those the contract leaves out), plus the marker.
NOT_STORED = {"date", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
              "upgrade", "proxy-authenticate", "proxy-authorization", "idempotent-replayed"}
POLICY_TTL = 7200  # IDEM_TTL_SECONDS given to the app: the policy must publish it, not the default
LEASE_SECONDS = 10  # IDEM_LEASE_SECONDS of the two_phase run
WAIT_MS = 20000  # IDEM_WAIT_MS of the waiting run: far longer than the request it waits for
START_TIMEOUT = 120  # seconds for an app to answer /healthz (a failure, not a verdict on speed)


class Response:
    def __init__(self, status, headers, body, error=None):
        self.status, self.headers, self.body, self.error = status, headers, body, error

    def header(self, name):
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        return values[0] if values else None

    def stored_headers(self):
        return sorted((k.lower(), v) for k, v in self.headers if k.lower() not in NOT_STORED)

    def json(self):
        try:
            return json.loads(self.body.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None

    def replayed(self):
        return (self.header("Idempotent-Replayed") or "").strip().lower() == "true"

    def __repr__(self):
        if self.error:
            return "<no answer: %s>" % self.error
        return "<%s %s %r>" % (self.status, self.headers, self.body[:300])


class App:
    """The app's process: started, killed and restarted by this script."""

    def __init__(self, command, port, database_url, log_path):
        self.command, self.port, self.database_url, self.log_path = command, port, database_url, log_path
        self.proc, self.env_extra = None, {}

    def start(self, **env):
        self.env_extra = {k: str(v) for k, v in env.items()}
        self._spawn()

    def _spawn(self):
        env = dict(os.environ)
        env.update({"DATABASE_URL": self.database_url, "LISTEN": "127.0.0.1:%d" % self.port,
                    "IDEM_TTL_SECONDS": str(POLICY_TTL)})
        env.update(self.env_extra)
        log = open(self.log_path, "ab")
        log.write(("# start: %s %s\n" % (" ".join("%s=%s" % kv for kv in sorted(self.env_extra.items())),
                                           " ".join(self.command))).encode())
        log.flush()
        self.proc = subprocess.Popen(self.command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("the app exited with %s before answering /healthz (log: %s)"
                                   % (self.proc.returncode, self.log_path))
            r = request("GET", self.port, "/healthz", timeout=2)
            if r.status == 200:
                return
            time.sleep(0.1)
        raise RuntimeError("the app did not answer GET /healthz within %d s (log: %s)"
                           % (START_TIMEOUT, self.log_path))

    def kill(self):
        """SIGKILL to the app's whole process group (an interpreter and its children)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None

    def restart(self):
        self.kill()
        self._spawn()

    def stop(self):
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        self.kill()


def request(method, port, path, body=b"", headers=(), timeout=60):
    """One request on a fresh connection, headers sent exactly as given (names and values)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        if method in ("POST", "PATCH", "PUT"):
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body if body else None)
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, resp.getheaders(), data)
    except (OSError, http.client.HTTPException) as e:
        return Response(None, [], b"", error="%s: %s" % (type(e).__name__, e))
    finally:
        conn.close()


class Suite:
    def __init__(self, args):
        self.args, self.passed, self.failed = args, 0, 0
        self.db = psycopg.connect(args.database_url, autocommit=True)
        # A superuser's connection to the same database, to read the keys' table (optional).
        self.admin = psycopg.connect(args.admin_url, autocommit=True) if args.admin_url else None
        self.app = App(args.command, args.port, args.database_url, args.log)
        self.mode = "inbox"
        self.problem_types = set()
        self.prefix = "s%d-r%d" % (args.seed, self.scalar("SELECT coalesce(max(id), 0) FROM payments"))
        # Every key, body and UUID comes from this generator: the same seed and database, the same run.
        self.rng = random.Random(self.prefix)

    # --- reporting -------------------------------------------------------------------------
    def check(self, name, ok, detail=""):
        label = "%s [%s]" % (name, self.mode)
        if ok:
            self.passed += 1
            print("ok - %s" % label, flush=True)
        else:
            self.failed += 1
            print("not ok - %s%s" % (label, ("\n    " + str(detail).replace("\n", "\n    ")) if detail else ""),
                  flush=True)
        return ok

    # --- helpers -----------------------------------------------------------------------------
    def scalar(self, sql, params=()):
        return self.db.execute(sql, params).fetchone()[0]

    def rows(self, note):
        return self.scalar("SELECT count(*) FROM payments WHERE note = %s", (note,))

    def key(self, case):
        return "%s-%s-%s-%08x" % (self.prefix, self.mode, case, self.rng.getrandbits(32))

    def note(self, case):
        return "%s-%s-%s" % (self.prefix, self.mode, case)

    def post(self, path, key=None, body=b"", tenant=None, extra=(), raw_key=False, timeout=60):
        headers = [("Content-Type", "application/json")] if path == "/payments" else []
        if key is not None:
            headers.append(("Idempotency-Key", key if raw_key else '"%s"' % key))
        if tenant is not None:
            headers.append(("X-Tenant", tenant))
        headers += list(extra)
        return request("POST", self.args.port, path, body, headers, timeout=timeout)

    def payment(self, amount, note, compact=False):
        doc = {"amount": amount, "note": note}
        return json.dumps(doc, separators=(",", ":") if compact else (", ", ": ")).encode()

    def problem(self, name, r, status):
        """r is the middleware's problem answer with this status."""
        doc = r.json()
        ok = (r.status == status and (r.header("Content-Type") or "").split(";")[0].strip() == "application/problem+json"
              and isinstance(doc, dict) and isinstance(doc.get("type"), str) and doc["type"] != ""
              and isinstance(doc.get("title"), str) and doc.get("status") == status
              and isinstance(doc.get("detail"), str))
        if ok:
            self.problem_types.add(doc["type"])
        return self.check("%s: %d application/problem+json with type, title, status, detail" % (name, status), ok, r)

    def is_replay_of(self, name, first, again):
        """again is first replayed: status, stored headers and body byte for byte, with the marker."""
        self.check("%s: the replay has the first answer's status (%s)" % (name, first.status),
                   again.status == first.status, again)
        self.check("%s: the replay's body is the first's byte for byte" % name, again.body == first.body,
                   "first %r\nagain %r" % (first.body[:300], again.body[:300]))
        self.check("%s: the replay has the first answer's headers" % name,
                   again.stored_headers() == first.stored_headers(),
                   "first %s\nagain %s" % (first.stored_headers(), again.stored_headers()))
        self.check("%s: the replay says Idempotent-Replayed: true, the first answer did not" % name,
                   again.replayed() and not first.replayed(), "first %r\nagain %r" % (first, again))

    def hold(self, key, body, sleep_ms):
        """Sends a request that sleeps sleep_ms in the handler, in a thread, and returns once it
        holds the key: a probe under the key (the same request, made to fail: a 500 is not
        stored, so a probe that wins the claim leaves nothing behind) is answered 409. A held
        request that was itself answered 409 (the probe held the key then) is sent again.
        Returns (thread, holder dict: "r" the held request's answer) or (None, None)."""
        holder = {}

        def send():
            holder["r"] = self.post("/payments", key, body, extra=[("X-Sleep-Ms", str(sleep_ms))], timeout=700)

        thread = threading.Thread(target=send)
        thread.start()
        for _ in range(2000):
            probe = self.post("/payments", key, body, extra=[("X-Fail", "raise")])
            if probe.status == 409:
                return thread, holder
            if not thread.is_alive():  # the held request ended: it met the probe's claim (409)
                thread.join()
                if holder["r"].status != 409:
                    return None, holder
                thread = threading.Thread(target=send)
                thread.start()
            time.sleep(0.02)
        return None, holder

    def wait_no_open_transaction(self):
        """Until no session of the app's role but this one is inside a transaction."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            n = self.scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = current_user "
                            "AND datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL")
            if n == 0:
                return True
            time.sleep(0.05)
        return False

    def wait_idle_in_transaction(self):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            n = self.scalar("SELECT count(*) FROM pg_stat_activity WHERE usename = current_user "
                            "AND datname = current_database() AND pid <> pg_backend_pid() "
                            "AND state = 'idle in transaction'")
            if n > 0:
                return True
            time.sleep(0.02)
        return False

    # --- cases -------------------------------------------------------------------------------
    def case_routes(self):
        r = request("GET", self.args.port, "/healthz")
        self.check("GET /healthz: 200 ok", r.status == 200 and r.body.strip() == b"ok", r)
        r = request("GET", self.args.port, "/no-such-route-%d" % self.rng.getrandbits(16))
        self.check("an unknown route: 404", r.status == 404, r)

    def case_policy(self):
        r = request("GET", self.args.port, "/idempotency-policy")
        want = {"header": "Idempotency-Key", "required_for": ["POST", "PATCH"], "max_length": 255,
                "ttl_seconds": POLICY_TTL}
        doc = r.json()
        self.check("policy: 200 application/json", r.status == 200 and
                   (r.header("Content-Type") or "").split(";")[0].strip() == "application/json", r)
        self.check("policy: the document (ttl_seconds from IDEM_TTL_SECONDS=%d)" % POLICY_TTL,
                   isinstance(doc, dict) and {k: doc.get(k) for k in want} == want, r)

    def case_replay(self):
        note, key = self.note("replay"), self.key("replay")
        body = self.payment(1001, note)
        first = self.post("/payments", key, body)
        doc = first.json() or {}
        self.check("replay: the first POST is 201 with the payment", first.status == 201 and
                   doc.get("amount") == 1001 and doc.get("tenant") == "default" and isinstance(doc.get("id"), int), first)
        self.check("replay: the first answer has Location /payments/<id> and X-Request-Nonce",
                   first.header("Location") == "/payments/%s" % doc.get("id") and bool(first.header("X-Request-Nonce")),
                   first)
        again = self.post("/payments", key, body)
        self.is_replay_of("replay", first, again)
        self.check("replay: one row in payments", self.rows(note) == 1, self.rows(note))
        if self.admin is not None:
            # Inbox: the payment and the key's completion commit together (a handler in a savepoint
            # writes with a subtransaction's xid: so the commit timestamps, which a subtransaction
            # shares with its top transaction, when track_commit_timestamp is on; else the xids).
            # two_phase: the payment is an outside effect, committed before the completion.
            ts = self.admin.execute("SELECT current_setting('track_commit_timestamp')::bool").fetchone()[0]
            same = self.admin.execute(
                ("SELECT pg_xact_commit_timestamp(k.xmin) = pg_xact_commit_timestamp(p.xmin) " if ts else
                 "SELECT k.xmin::text = p.xmin::text ") +
                "FROM idempotency.idempotency_keys k, payments p WHERE position(%s in k.key) > 0 AND p.note = %s",
                (key, note)).fetchall()
            want = self.mode.startswith("inbox")
            self.check("replay: the payment was written %s the key's completion (%s)"
                       % ("in the transaction of" if want else "outside the transaction of",
                          "commit timestamps" if ts else "xmin"),
                       [tuple(r) for r in same] == [(want,)], same)
        # The same JSON, its keys in another order and other spacing: the same request.
        reordered = json.dumps({"note": note, "amount": 1001}, separators=(",", ":")).encode()
        third = self.post("/payments", key, reordered)
        self.check("JSON key order: the reordered body is a replay, not a 422",
                   third.status == 201 and third.replayed() and third.body == first.body, third)
        # Another body under the key: 422 with nothing of the stored answer.
        other = self.post("/payments", key, self.payment(1002, note))
        self.problem("another body", other, 422)
        stored = [v for _, v in first.stored_headers() if len(v) > 8] + [str(doc.get("id"))]
        leaked = [v for v in (first.header("X-Request-Nonce"), first.header("Location")) if v and v.encode() in other.body]
        self.check("another body: 422 returns nothing of the stored answer (no Location, nonce, marker)",
                   not leaked and other.header("Location") is None and other.header("X-Request-Nonce") is None
                   and not other.replayed() and b'"amount"' not in other.body, (other, stored))
        self.check("another body: still one row", self.rows(note) == 1, self.rows(note))

    def case_keys(self):
        note = self.note("keys")
        body = self.payment(7, note)
        r = self.post("/payments", None, body)
        self.problem("a POST without Idempotency-Key", r, 400)
        bad = [("an empty key", ""), ("an empty quoted key", '""'), ("an unterminated quoted key", '"abc'),
               ("a bare key with a space", "ab cd"), ("a quoted key with a non-ASCII byte", '"caf\xe9"'),
               ("a quoted key with a control character", '"a\tb"'), ("a bare key with a comma", "a,b"),
               ("a 256-byte bare key", "k" * 256), ("a 256-byte quoted key", '"%s"' % ("q" * 256)),
               ("a quoted key with a bad escape", '"a\\nb"')]
        for name, value in bad:
            r = self.post("/payments", value, body, raw_key=True)
            self.problem(name, r, 400)
        self.check("no bad key made a row", self.rows(note) == 0, self.rows(note))
        # The accepted forms, and that a quoted and a bare spelling of one key are one key.
        tag = "%08x" % self.rng.getrandbits(32)
        quoted = self.post("/payments", '"%s-%s-q1"' % (self.prefix, tag), body, raw_key=True)
        self.check("a quoted key: 201", quoted.status == 201 and not quoted.replayed(), quoted)
        bare = self.post("/payments", "%s-%s-q1" % (self.prefix, tag), body, raw_key=True)
        self.check("the same key bare: the replay of the quoted one (one key)",
                   bare.status == 201 and bare.replayed() and bare.body == quoted.body, bare)
        uid = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        r = self.post("/payments", uid, body, raw_key=True)
        self.check("a bare UUID: 201", r.status == 201 and not r.replayed(), r)
        r = self.post("/payments", "%s:%s/x~y" % (tag, self.mode), body, raw_key=True)
        self.check("a bare token with ':' and '/': 201", r.status == 201 and not r.replayed(), r)
        r = self.post("/payments", '"%s \\"x\\" \\\\ %s"' % (tag, self.mode), body, raw_key=True)
        self.check('a quoted key with \\" and \\\\ escapes and a space: 201', r.status == 201, r)
        r2 = self.post("/payments", '"%s \\"x\\" \\\\ %s"' % (tag, self.mode), body, raw_key=True)
        self.check("the escaped key again: its replay", r2.status == 201 and r2.replayed() and r2.body == r.body, r2)
        k255 = ("%s-%s-" % (tag, self.mode)).ljust(255, "z")
        r = self.post("/payments", '"%s"' % k255, body, raw_key=True)
        self.check("a 255-byte key: 201", r.status == 201, r)
        self.check("the accepted keys made 5 rows", self.rows(note) == 5, self.rows(note))

    def case_raise(self):
        note, key = self.note("raise"), self.key("raise")
        body = self.payment(13, note)
        r = self.post("/payments", key, body, extra=[("X-Fail", "raise")])
        self.check("a handler that raises: 500", r.status == 500, r)
        self.check("a handler that raises: no row", self.rows(note) == 0, self.rows(note))
        again = self.post("/payments", key, body)
        self.check("its retry runs afresh: 201, not a replay", again.status == 201 and not again.replayed(), again)
        self.check("its retry: one row", self.rows(note) == 1, self.rows(note))

        note, key = self.note("503"), self.key("503")
        body = self.payment(14, note)
        r = self.post("/payments", key, body, extra=[("X-Fail", "503")])
        self.check("a 503 from the handler: 503 {\"error\":\"unavailable\"}",
                   r.status == 503 and (r.json() or {}).get("error") == "unavailable", r)
        again = self.post("/payments", key, body)
        self.check("the retry of the 503 runs afresh: 201", again.status == 201 and not again.replayed(), again)
        self.check("the retry of the 503: one row", self.rows(note) == 1, self.rows(note))

        note, key = self.note("400"), self.key("400")
        body = self.payment(15, note)
        first = self.post("/payments", key, body, extra=[("X-Fail", "400")])
        self.check("a 400 from the handler: 400 {\"error\":\"bad amount\"}",
                   first.status == 400 and (first.json() or {}).get("error") == "bad amount", first)
        again = self.post("/payments", key, body)
        self.is_replay_of("the stored 400", first, again)
        self.check("the stored 400: no row", self.rows(note) == 0, self.rows(note))

    def case_concurrent(self, n=50):
        note, key = self.note("concurrent"), self.key("concurrent")
        body = self.payment(50, note)
        barrier = threading.Barrier(n)
        answers = [None] * n

        def one(i):
            barrier.wait()
            answers[i] = self.post("/payments", key, body, extra=[("X-Sleep-Ms", "300")])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        created = [a for a in answers if a.status == 201 and not a.replayed()]
        replays = [a for a in answers if a.status == 201 and a.replayed()]
        conflicts = [a for a in answers if a.status == 409]
        others = [a for a in answers if a.status not in (201, 409)]
        self.check("%d concurrent duplicates: every answer 201, 409 or a replay (%d, %d, %d)"
                   % (n, len(created), len(conflicts), len(replays)), not others, others[:3])
        self.check("%d concurrent duplicates: exactly one 201 that is not a replay" % n, len(created) == 1,
                   len(created))
        self.check("%d concurrent duplicates: every replay is that 201's body" % n,
                   all(a.body == created[0].body for a in replays) if created else False)
        bad409 = [a for a in conflicts if not re.fullmatch(r"[1-9][0-9]*", (a.header("Retry-After") or "").strip())
                  or (a.header("Content-Type") or "").split(";")[0].strip() != "application/problem+json"]
        self.check("%d concurrent duplicates: every 409 is problem+json with Retry-After >= 1 s" % n,
                   not bad409, bad409[:3])
        self.check("%d concurrent duplicates: exactly one row in payments" % n, self.rows(note) == 1, self.rows(note))

    def case_binary(self):
        tenant = "%s-%s-echo-%08x" % (self.prefix, self.mode, self.rng.getrandbits(32))
        key = self.key("echo")
        data = bytes(self.rng.getrandbits(8) for _ in range(4096)) + b"\x00\xff\r\n\x80"
        ctype = [("Content-Type", "application/x-conformance; charset=binary")]
        first = self.post("/echo", key, data, tenant=tenant, extra=ctype)
        self.check("binary echo: 200, the same bytes, the request's Content-Type",
                   first.status == 200 and first.body == data and
                   first.header("Content-Type") == "application/x-conformance; charset=binary", first)
        again = self.post("/echo", key, data, tenant=tenant, extra=ctype)
        self.is_replay_of("binary echo", first, again)
        self.check("binary echo: the replay's X-Request-Nonce is the stored one",
                   again.header("X-Request-Nonce") == first.header("X-Request-Nonce") is not None, again)
        other = self.post("/echo", key, data[:-1] + b"\x01", tenant=tenant, extra=ctype)
        self.problem("binary echo, one byte changed", other, 422)
        rows = self.scalar("SELECT count(*) FROM payments WHERE tenant = %s AND note = 'echo'", (tenant,))
        self.check("binary echo: one row", rows == 1, rows)

    def case_tenants(self):
        note, key = self.note("tenants"), self.key("tenants")
        body = self.payment(21, note)
        ta, tb = "tenant-a-%s" % self.mode, "tenant-b-%s" % self.mode
        a = self.post("/payments", key, body, tenant=ta)
        b = self.post("/payments", key, body, tenant=tb)
        self.check("two tenants, one key: two 201s, neither a replay",
                   a.status == 201 and b.status == 201 and not a.replayed() and not b.replayed(), (a, b))
        self.check("two tenants, one key: two payments, each the tenant's",
                   (a.json() or {}).get("tenant") == ta and (b.json() or {}).get("tenant") == tb
                   and (a.json() or {}).get("id") != (b.json() or {}).get("id"), (a, b))
        a2 = self.post("/payments", key, body, tenant=ta)
        self.check("two tenants: tenant a's retry replays a's answer", a2.replayed() and a2.body == a.body, a2)
        self.check("two tenants: two rows", self.rows(note) == 2, self.rows(note))

    def case_kill(self):
        note, key = self.note("kill"), self.key("kill")
        body = self.payment(99, note)
        thread, holder = self.hold(key, body, 600000)
        self.check("kill: a request sleeping in the handler holds the key (a duplicate gets 409)",
                   thread is not None, holder)
        held_at = time.monotonic()
        self.app.kill()
        if thread is not None:
            thread.join()
            self.check("kill: the request in flight got no answer", holder["r"].status is None, holder["r"])
        # The killed app's session ends (its transaction rolls back) once PostgreSQL reads EOF.
        self.check("kill: the killed app's transaction ended", self.wait_no_open_transaction())
        self.check("kill: no row from the killed request", self.rows(note) == 0, self.rows(note))
        self.app.restart()
        r = self.post("/payments", key, body)
        if self.mode == "inbox":
            self.check("kill, inbox: the retry after the restart runs afresh at once (the claim rolled back)",
                       r.status == 201 and not r.replayed(), r)
        else:
            if r.status == 201 and time.monotonic() - held_at >= LEASE_SECONDS - 1:
                # The restart took about the lease: the 409 cannot be expected (no verdict on speed).
                print("# kill, two_phase: the restart took %.0f s of the %d s lease: the 409 within it is not "
                      "checked" % (time.monotonic() - held_at, LEASE_SECONDS))
            else:
                self.problem("kill, two_phase: the retry within the lease", r, 409)
                ra = (r.header("Retry-After") or "").strip()
                self.check("kill, two_phase: Retry-After is whole seconds, 1 to the lease (%d)" % LEASE_SECONDS,
                           re.fullmatch(r"[0-9]+", ra) is not None and 1 <= int(ra) <= LEASE_SECONDS, ra)
            answers = []
            for _ in range(10 * LEASE_SECONDS):  # as a client does: again after Retry-After, until answered
                if r.status != 409:
                    break
                time.sleep(int((r.header("Retry-After") or "1").strip() or 1))
                r = self.post("/payments", key, body)
                answers.append(r.status)
            self.check("kill, two_phase: after the lease the retry runs afresh (reclaimed): 201 (answers %s)"
                       % answers, r.status == 201 and not r.replayed(), r)
        self.check("kill: one row after the retry", self.rows(note) == 1, self.rows(note))

    def case_store_errors(self):
        note, key = self.note("stored-raise"), self.key("stored-raise")
        body = self.payment(31, note)
        first = self.post("/payments", key, body, extra=[("X-Fail", "raise")])
        self.check("IDEM_STORE_ERRORS=1: a handler that raises: 500", first.status == 500, first)
        again = self.post("/payments", key, body)
        self.check("IDEM_STORE_ERRORS=1: its retry is the stored 500, replayed",
                   again.status == 500 and again.replayed() and again.body == first.body, again)
        note, key = self.note("stored-503"), self.key("stored-503")
        body = self.payment(32, note)
        first = self.post("/payments", key, body, extra=[("X-Fail", "503")])
        again = self.post("/payments", key, body)
        self.is_replay_of("IDEM_STORE_ERRORS=1: the stored 503", first, again)
        self.check("IDEM_STORE_ERRORS=1: no rows", self.rows(self.note("stored-raise")) + self.rows(note) == 0)

    def case_wait(self):
        note, key = self.note("wait"), self.key("wait")
        body = self.payment(41, note)
        holder = {}

        def first():
            holder["r"] = self.post("/payments", key, body, extra=[("X-Sleep-Ms", "1500")])

        t = threading.Thread(target=first)
        t.start()
        # In inbox mode the claim's transaction is idle while the handler sleeps: then it is in flight.
        self.check("IDEM_WAIT_MS: the first request holds its claim (idle in transaction)",
                   self.wait_idle_in_transaction())
        dup = self.post("/payments", key, body)
        t.join()
        r = holder["r"]
        self.check("IDEM_WAIT_MS: the first request: 201", r.status == 201 and not r.replayed(), r)
        self.check("IDEM_WAIT_MS=%d: the duplicate in flight waited and got the replay, not 409" % WAIT_MS,
                   dup.status == 201 and dup.replayed() and dup.body == r.body, dup)
        self.check("IDEM_WAIT_MS: one row", self.rows(note) == 1, self.rows(note))

    # --- runs --------------------------------------------------------------------------------
    def run(self):
        modes = self.args.modes.split(",")
        try:
            for mode in modes:
                self.mode = mode
                env = {"IDEM_MODE": mode}
                if mode == "two_phase":
                    env["IDEM_LEASE_SECONDS"] = LEASE_SECONDS
                print("# %s: %s, IDEM_MODE=%s" % (self.args.name, " ".join(self.args.command), mode), flush=True)
                self.app.start(**env)
                self.case_routes()
                self.case_policy()
                self.case_replay()
                self.case_keys()
                self.case_raise()
                self.case_concurrent()
                self.case_binary()
                self.case_tenants()
                self.case_kill()
                self.app.stop()
            if "inbox" in modes:
                self.mode = "inbox+store_errors"
                self.app.start(IDEM_MODE="inbox", IDEM_STORE_ERRORS=1)
                self.case_store_errors()
                self.app.stop()
                self.mode = "inbox+wait"
                self.app.start(IDEM_MODE="inbox", IDEM_WAIT_MS=WAIT_MS)
                self.case_wait()
                self.app.stop()
            self.mode = "all"
            if self.admin is not None:
                owners = self.admin.execute("SELECT DISTINCT owner FROM idempotency.idempotency_keys").fetchall()
                self.check("every key belongs to the app's role (%s)" % owners,
                           owners == self.db.execute("SELECT current_user").fetchall())
            self.check("every problem answer names the same policy URL as its type (%s)" % sorted(self.problem_types),
                       len(self.problem_types) == 1)
        except Exception as e:  # an app that cannot start, or a case that broke: one failure, said why
            self.check("the run could not go on: %s: %s" % (type(e).__name__, e), False)
        finally:
            self.app.stop()
        print("conformance-%s: %d passed, %d failed" % (self.args.name, self.passed, self.failed), flush=True)
        return self.failed == 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="go, python-flask, ...: the summary line's name")
    p.add_argument("--port", type=int, required=True, help="the app's port on 127.0.0.1 (LISTEN)")
    p.add_argument("--database-url", required=True, help="the app's DATABASE_URL (the role app)")
    p.add_argument("--admin-url", default=None,
                   help="a superuser's connection to the app's database: also check the transactions (xmin)")
    p.add_argument("--seed", type=int, default=20261205)
    p.add_argument("--modes", default="inbox,two_phase")
    p.add_argument("--log", default=None, help="the app's output (default: conformance-NAME.log here)")
    p.add_argument("command", nargs="+", help="the app's command line (after --)")
    args = p.parse_args()
    args.log = args.log or "conformance-%s.log" % args.name
    print("# conformance-%s: seed %d (--seed to repeat), app log %s" % (args.name, args.seed, args.log), flush=True)
    return 0 if Suite(args).run() else 1


if __name__ == "__main__":
    sys.exit(main())
