#!/usr/bin/python3
"""Exactly-once harness: payment messages delivered 2-5 times each, shuffled, to >= 8
concurrent consumer processes, while consumers are killed with SIGKILL mid-transaction and
mid-two-phase and the server is crashed (pg_ctl stop -m immediate) and restarted.

  chaos.py run --workdir DIR [--port P] [--messages N] [--consumers C] [--crashes K]
               [--pgbouncer] [--seed S] [--patterns inbox,2pc,batch] [--batch-size B]
  chaos.py consumer ...        (started by `run`; one consumer process)

`run` makes its own throw-away cluster in DIR (initdb as the postgres user when run as
root, shared_preload_libraries = 'idempotency'), plays the message broker (at-least-once:
a delivery whose consumer dies unacknowledged is delivered again; `in_progress` is answered
by redelivering after retry_after), injects the faults, checks the end state, prints the
figures and one "ok"/"not ok" line per assertion, and ends with "N passed, N failed".

The consumers connect as an application role (chaos_app: USAGE on schema idempotency,
rights on the business tables only) and call the functions schema-qualified, as the
README shows. The random seed is fixed (DEFAULT_SEED) unless --seed gives another, and
always printed.

Patterns (--patterns, default inbox,2pc: half of the messages each; messages take the
listed patterns in turn):
  inbox      one transaction: claim_key, debit the account, complete_key, COMMIT.
  two-phase  claim_key + COMMIT; external call (a line appended to a side-effect log
             file); checkpoint_key(..., 'charged') + COMMIT; complete_key + COMMIT.
             A reclaimer that finds recovery_point = 'charged' skips the external call.
  batch      the broker hands a consumer up to --batch-size deliveries at once (copies of
             one message often share a batch); one transaction: claim_keys of all of them
             (server-computed fingerprints), debit the account of each first occurrence
             that claimed its key, complete_keys of those, COMMIT; then one acknowledgement
             per delivery: applied, replay, mismatch, duplicate (a later occurrence of a
             key claimed earlier in the batch) or in_progress (redelivered after
             retry_after). Consumers are killed inside the batch transaction; every
             unacknowledged delivery of the batch is delivered again.
"""

import argparse
import collections
import decimal
import heapq
import json
import os
import random
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time

D = decimal.Decimal

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from valgrind_support import VALGRIND, valgrind_checks, valgrind_opts  # noqa: E402


LEASE = "2 seconds"
# The role the consumers connect as (keys belong to it).
APP_ROLE = "chaos_app"
# No verdict may depend on the day the test runs: the seed is fixed unless one is given.
DEFAULT_SEED = 20261201

# Phases a consumer reports just before (or after, for committed steps) the step; the
# coordinator kills consumers at some of them.
KILL_PHASES = ("inbox_tx", "claimed", "calling", "called", "checkpointed", "completing",
               "batch_tx", "batch_completing")
# A kill whose last reported phase is one of these may have left an external call made but
# not checkpointed: the only crashes that may repeat the external call.
WINDOW_PHASES = ("calling", "called")
# Kills at these phases happen after the two-phase claim committed and before the
# completing transaction started: the claim must later be reclaimed and completed.
HELD_PHASES = ("claimed", "calling", "called", "checkpointed")
# Phases inside a batch transaction: after the effects, after complete_keys (before COMMIT).
BATCH_PHASES = ("batch_tx", "batch_completing")
PATTERNS = ("inbox", "2pc", "batch")


# --------------------------------------------------------------------------------------
# Consumer
# --------------------------------------------------------------------------------------

def consumer_main(args):
    import psycopg
    from psycopg import errors

    out = sys.stdout

    def say(*parts):
        out.write(" ".join(str(p) for p in parts) + "\n")
        out.flush()

    def phase(name, pause=True):
        say("P", name)
        # A short pause so that a kill decided on this phase lands in it.
        if pause:
            time.sleep(random.uniform(0.004, 0.012))

    conn = None

    def connect():
        nonlocal conn
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
            conn = None
        deadline = time.time() + 90
        delay = 0.05
        while True:
            try:
                # No server-side prepared statements: works behind PgBouncer in
                # transaction pooling mode (no session state).
                conn = psycopg.connect(args.dsn, autocommit=False, prepare_threshold=None,
                                       connect_timeout=5)
                return
            except psycopg.OperationalError:
                if time.time() > deadline:
                    raise
                say("E", "reconnect_wait", "-")
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    losses = [0]

    def connection_problem(e):
        # psycopg maps SQLSTATE class 55 (a fenced token: 55000), 40 and 57014 to
        # OperationalError too: only a closed connection, class 08 or a server shutdown
        # (57P0x) is a lost connection to reconnect after.
        return conn.closed or e.sqlstate is None or e.sqlstate.startswith("08") or e.sqlstate.startswith("57P")

    def lost_connection():
        say("E", "connection_lost", "-")
        # Behind PgBouncer the client connection survives a server crash while every
        # query fails until the server is back: back off between attempts.
        time.sleep(min(0.05 * (2 ** losses[0]), 1.0))
        losses[0] += 1
        connect()

    extlog = os.open(args.extlog, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def claim(cur, msg, payload, scope):
        cur.execute(
            "SELECT status::text, token, response, recovery_point, attempts,"
            " extract(epoch FROM retry_after)::float8"
            " FROM idempotency.claim_key(%s, idempotency.request_fingerprint(%s::jsonb), %s, NULL, %s::interval)",
            (msg, payload, scope, LEASE))
        return cur.fetchone()

    def payload_of(d):
        return json.dumps({"msg": d["m"], "amount": d["a"], "acct": d["acct"]})

    def check_replay(d, response):
        if response is None or response.get("msg") != d["m"] or D(response["amount"]) != D(d["a"]):
            say("E", "bad_replay", d["m"])

    def inbox(d, payload):
        while True:
            try:
                with conn.cursor() as cur:
                    st, token, response, _rp, attempts, retry = claim(cur, d["m"], payload, "inbox")
                    if st in ("claimed", "reclaimed"):
                        cur.execute("UPDATE accounts SET balance = balance - %s::numeric WHERE id = %s",
                                    (d["a"], d["acct"]))
                        cur.execute("INSERT INTO inbox_applied (msg, token, amount) VALUES (%s, %s, %s)",
                                    (d["m"], token, d["a"]))
                        phase("inbox_tx")
                        # `SELECT ... FROM f(...)`: a form Citus delegates to the key's node, as it
                        # did the claim (one transaction must not mix delegated and other calls).
                        cur.execute("SELECT status::text FROM idempotency.complete_key(%s, %s, %s::jsonb, 200, 'inbox')",
                                    (d["m"], token, payload))
                        conn.commit()
                        losses[0] = 0
                        return ("applied", st)
                    conn.rollback()
                    if st == "replay":
                        check_replay(d, response)
                        if args.sabotage == "debit-on-replay":
                            # A broken consumer: applies the effect although the key replays.
                            cur.execute("UPDATE accounts SET balance = balance - %s::numeric WHERE id = %s",
                                        (d["a"], d["acct"]))
                            conn.commit()
                        return ("replay", "-")
                    if st == "mismatch":
                        return ("mismatch", "-")
                    return ("retry", retry)
            except psycopg.OperationalError as e:
                # The transaction is gone (or committed: then the next claim replays).
                if not connection_problem(e):
                    say("E", "unexpected_error_" + str(e.sqlstate), d["m"])
                    conn.rollback()
                    return ("retry", 0.2)
                lost_connection()

    def two_phase(d, payload):
        token = None
        rp = None
        called = False
        checkpointed = False
        st = None
        unexpected = 0
        while True:
            try:
                with conn.cursor() as cur:
                    if token is None:
                        st, tok, response, got_rp, attempts, retry = claim(cur, d["m"], payload, "2pc")
                        conn.commit()
                        # Only a committed claim holds the key: an external call made on a
                        # claim whose COMMIT was lost would be made without any claim.
                        token, rp = tok, got_rp
                        if args.sabotage == "ignore-recovery-point":
                            # A broken consumer: repeats the external call on every reclaim.
                            rp = None
                        if st == "replay":
                            check_replay(d, response)
                            return ("replay", "-")
                        if st == "mismatch":
                            return ("mismatch", "-")
                        if st == "in_progress":
                            return ("retry", retry)
                        if st == "reclaimed" and rp is not None:
                            say("E", "resumed_from_" + rp, d["m"])
                        phase("claimed")
                    if rp != "charged":
                        if not called:
                            phase("calling")
                            # The external call: the payment gateway executes the charge.
                            os.write(extlog, ("%s %s %s\n" % (d["m"], token, d["a"])).encode())
                            called = True
                            phase("called")
                        cur.execute("SELECT idempotency.checkpoint_key(%s, %s, 'charged', '2pc', %s::interval)",
                                    (d["m"], token, LEASE))
                        conn.commit()
                        rp = "charged"
                        checkpointed = True
                        phase("checkpointed")
                    phase("completing")
                    cur.execute("INSERT INTO twophase_done (msg, token) VALUES (%s, %s)"
                                " ON CONFLICT DO NOTHING", (d["m"], token))
                    cur.execute("SELECT (idempotency.complete_key(%s, %s, %s::jsonb, 200, '2pc')).status::text",
                                (d["m"], token, payload))
                    conn.commit()
                    losses[0] = 0
                    return ("applied", st)
            except (errors.ObjectNotInPrerequisiteState, errors.NoDataFound):
                # Fenced (before the OperationalError clause: psycopg makes 55000 one):
                # our lease ended and another consumer reclaimed the key.
                conn.rollback()
                if called and not checkpointed:
                    say("E", "lease_lost_after_call", d["m"])
                else:
                    say("E", "fenced", d["m"])
                return ("retry", 0.2)
            except psycopg.OperationalError as e:
                if not connection_problem(e):
                    # Any other server error (seen: 58P01 while the library file was being
                    # reinstalled): keep the claim and retry the same step, as a real
                    # consumer would; giving the claim up after the external call would
                    # make the next holder call again. Counted as a failure of the run.
                    say("E", "unexpected_error_" + str(e.sqlstate), d["m"])
                    conn.rollback()
                    unexpected += 1
                    if unexpected > 100:
                        return ("retry", 0.2)
                    time.sleep(0.2)
                    continue
                lost_connection()

    def batch(ds):
        """One transaction for a batch of deliveries: claim_keys, the effect of each first
        occurrence that claimed its key, complete_keys, COMMIT. One (outcome, detail) per
        delivery, in order."""
        keys = [d["m"] for d in ds]
        payloads = [payload_of(d) for d in ds]
        while True:
            try:
                with conn.cursor() as cur:
                    cur.execute(
                        "SELECT status::text, token, response, extract(epoch FROM retry_after)::float8"
                        " FROM idempotency.claim_keys(%s::text[],"
                        " ARRAY(SELECT idempotency.request_fingerprint(p)"
                        " FROM unnest(%s::text[]::jsonb[]) WITH ORDINALITY AS u(p, i) ORDER BY i),"
                        " 'batch', NULL, %s::interval) ORDER BY ordinality",
                        (keys, payloads, LEASE))
                    rows = cur.fetchall()
                    outcomes = []
                    claimed = []             # (delivery, token, payload): first occurrences
                    effects = []             # deliveries whose effect this transaction applies
                    claimed_keys = set()
                    for d, payload, (st, token, response, retry) in zip(ds, payloads, rows):
                        if st in ("claimed", "reclaimed"):
                            claimed_keys.add(d["m"])
                            claimed.append((d, token, payload))
                            effects.append((d, token))
                            outcomes.append(("applied", st))
                        elif st == "in_progress" and d["m"] in claimed_keys:
                            # A later copy of a key this batch claimed: a duplicate delivery.
                            outcomes.append(("duplicate", "-"))
                            if args.sabotage == "apply-batch-duplicates":
                                # A broken consumer: applies every delivery whose key the
                                # batch claimed, the duplicates too.
                                effects.append((d, token))
                        elif st == "replay":
                            check_replay(d, response)
                            outcomes.append(("replay", "-"))
                        elif st == "mismatch":
                            outcomes.append(("mismatch", "-"))
                        else:
                            # in_progress: another consumer's open claim.
                            outcomes.append(("retry", retry))
                    if not claimed:
                        conn.rollback()
                        return outcomes
                    # Accounts in id order: concurrent batches lock them in the same order.
                    for d, token in sorted(effects, key=lambda e: e[0]["acct"]):
                        cur.execute("UPDATE batch_accounts SET balance = balance - %s::numeric WHERE id = %s",
                                    (d["a"], d["acct"]))
                        cur.execute("INSERT INTO batch_applied (msg, token, amount) VALUES (%s, %s, %s)",
                                    (d["m"], token, d["a"]))
                    phase("batch_tx")
                    cur.execute(
                        "SELECT count(*) FILTER (WHERE status = 'replay')"
                        " FROM idempotency.complete_keys(%s::text[], %s::uuid[], %s::text[]::jsonb[],"
                        " %s::int[], 'batch')",
                        ([d["m"] for d, _, _ in claimed], [t for _, t, _ in claimed],
                         [p for _, _, p in claimed], [200] * len(claimed)))
                    if cur.fetchone()[0] != len(claimed):
                        say("E", "bad_complete_keys", keys[0])
                    phase("batch_completing")
                    conn.commit()
                    losses[0] = 0
                    return outcomes
            except psycopg.OperationalError as e:
                # The transaction is gone (or committed: then the batch replays).
                if not connection_problem(e):
                    say("E", "unexpected_error_" + str(e.sqlstate), keys[0])
                    conn.rollback()
                    return [("retry", 0.2)] * len(ds)
                lost_connection()

    connect()
    for line in sys.stdin:
        d = json.loads(line)
        if isinstance(d, list):
            # A batch of deliveries: one transaction, then one acknowledgement each.
            for b, (outcome, detail) in zip(d, batch(d)):
                say("A", b["d"], outcome, detail)
            continue
        payload = payload_of(d)
        if d["p"] == "inbox":
            outcome, detail = inbox(d, payload)
        else:
            outcome, detail = two_phase(d, payload)
        say("A", d["d"], outcome, detail)


# --------------------------------------------------------------------------------------
# Coordinator: cluster, broker, faults, checks
# --------------------------------------------------------------------------------------

class Cluster:
    def __init__(self, workdir, port):
        self.workdir = workdir
        self.port = port
        self.data = os.path.join(workdir, "data")
        self.log = os.path.join(workdir, "server.log")
        self.root = os.geteuid() == 0

    def as_pg(self, argv, **kw):
        if self.root:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        return subprocess.run(argv, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              cwd=self.workdir, **kw)

    def init(self, extra_conf):
        if self.root:
            shutil.chown(self.workdir, "postgres")
        self.as_pg(["initdb", "-D", self.data, "-U", "postgres", "-A", "trust", "-E", "UTF8",
                    "--no-locale", "--no-sync"])
        conf = [
            "port = %d" % self.port,
            "listen_addresses = ''",
            "unix_socket_directories = '%s'" % self.workdir,
            "shared_preload_libraries = 'idempotency'",
            "max_connections = 60",
            "idempotency.cleanup_interval = '1s'",
            "log_min_messages = warning",
        ] + extra_conf
        with open(os.path.join(self.data, "postgresql.conf"), "a") as f:
            f.write("\n# chaos harness\n" + "\n".join(conf) + "\n")

    def start(self):
        self.as_pg(["pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60"] + valgrind_opts(self.workdir)
                   + ["start"])

    def crash(self):
        self.as_pg(["pg_ctl", "-D", self.data, "-m", "immediate", "-w", "-t", "60", "stop"])
        return "server"

    def logs(self):
        return [self.log]

    def stop(self):
        try:
            self.as_pg(["pg_ctl", "-D", self.data, "-m", "fast", "-w", "-t", "60", "stop"])
        except subprocess.CalledProcessError:
            pass


class CitusCluster:
    """--citus: a Citus coordinator and two workers on ports P, P+1 and P+2 (TCP on 127.0.0.1,
    the coordinator's socket in the workdir like a plain Cluster's). The key table is
    distributed by key with the recipe of test/citus/setup.sql; the business tables are Citus
    local tables on the coordinator, so that a consumer's transaction (its key on a worker's
    shard, its effect on the coordinator) commits with Citus' two-phase commit. Crashes take
    turns: a worker, the coordinator, the other worker, the coordinator, ..."""

    NAMES = ("coordinator", "worker1", "worker2")
    CRASH_ORDER = (1, 0, 2, 0)

    def __init__(self, workdir, port):
        self.workdir = workdir
        self.port = port
        self.nodes = []
        for i, name in enumerate(self.NAMES):
            os.makedirs(os.path.join(workdir, name), exist_ok=True)
            self.nodes.append(Cluster(os.path.join(workdir, name), port + i))
        self.down = []
        self.crashed = collections.Counter()

    def init(self, extra_conf):
        if os.geteuid() == 0:
            shutil.chown(self.workdir, "postgres")  # the coordinator's socket is here
        for node in self.nodes:
            if os.path.exists(node.data):
                shutil.rmtree(node.data)
            node.init([
                "listen_addresses = '127.0.0.1'",
                "unix_socket_directories = '%s'" % self.workdir,
                "shared_preload_libraries = 'citus,idempotency'",
                "max_prepared_transactions = 100",
                # Prepared transactions that a coordinator crash left on a worker are
                # committed or rolled back by the coordinator's recovery, this often.
                "citus.recover_2pc_interval = '2s'",
            ] + extra_conf)

    def start(self):
        for node in self.down or self.nodes:
            node.start()
        self.down = []

    def crash(self):
        i = self.CRASH_ORDER[sum(self.crashed.values()) % len(self.CRASH_ORDER)]
        self.nodes[i].crash()
        self.down.append(self.nodes[i])
        self.crashed[self.NAMES[i]] += 1
        return "%s (port %d)" % (self.NAMES[i], self.nodes[i].port)

    def stop(self):
        for node in self.nodes:
            node.stop()

    def logs(self):
        return [node.log for node in self.nodes]

    def prepare(self, psycopg, database):
        """After CREATE DATABASE on the coordinator: the database and Citus on every node,
        the workers added, the recipe applied (it creates the extension)."""
        for i, node in enumerate(self.nodes):
            dsn = "host=127.0.0.1 port=%d user=postgres dbname=%%s" % node.port
            if i > 0:
                with psycopg.connect(dsn % "postgres", autocommit=True) as c:
                    c.execute("CREATE DATABASE " + database)
            with psycopg.connect(dsn % database, autocommit=True) as c:
                c.execute("CREATE EXTENSION citus")
        with psycopg.connect("host=127.0.0.1 port=%d user=postgres dbname=%s" % (self.port, database),
                             autocommit=True) as c:
            c.execute("SELECT citus_set_coordinator_host('127.0.0.1', %d)" % self.port)
            for node in self.nodes[1:]:
                c.execute("SELECT citus_add_node('127.0.0.1', %d)" % node.port)
            with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "citus", "setup.sql")) as f:
                c.execute(f.read())


class PgBouncer:
    def __init__(self, workdir, port, server_port):
        self.workdir = workdir
        self.port = port
        self.ini = os.path.join(workdir, "pgbouncer.ini")
        self.pidfile = os.path.join(workdir, "pgbouncer.pid")
        with open(os.path.join(workdir, "userlist.txt"), "w") as f:
            f.write('"postgres" ""\n"%s" ""\n' % APP_ROLE)
        with open(self.ini, "w") as f:
            f.write("\n".join([
                "[databases]",
                "chaos = host=%s port=%d dbname=chaos" % (workdir, server_port),
                "[pgbouncer]",
                "listen_addr =",
                "listen_port = %d" % port,
                "unix_socket_dir = %s" % workdir,
                "auth_type = trust",
                "auth_file = %s" % os.path.join(workdir, "userlist.txt"),
                "pool_mode = transaction",
                # Fewer server connections than consumers: transactions of different
                # clients share server sessions.
                "default_pool_size = 4",
                "max_client_conn = 200",
                "server_login_retry = 1",
                "ignore_startup_parameters = extra_float_digits,options",
                "logfile = %s" % os.path.join(workdir, "pgbouncer.log"),
                "pidfile = %s" % self.pidfile,
            ]) + "\n")
        if os.geteuid() == 0:
            for name in ("pgbouncer.ini", "userlist.txt"):
                shutil.chown(os.path.join(workdir, name), "postgres")

    def start(self):
        argv = ["pgbouncer", "-d", self.ini]
        if os.geteuid() == 0:
            argv = ["runuser", "-u", "postgres", "--"] + argv
        subprocess.run(argv, check=True, cwd=self.workdir)
        for _ in range(100):
            if os.path.exists(os.path.join(self.workdir, ".s.PGSQL.%d" % self.port)):
                return
            time.sleep(0.05)
        raise RuntimeError("pgbouncer did not start")

    def stop(self):
        try:
            with open(self.pidfile) as f:
                pid = int(f.read().strip())
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.05)
        except (OSError, ValueError):
            pass


class Consumer:
    def __init__(self, cid, argv):
        self.cid = cid
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0)
        self.buf = b""
        self.inflight = None
        self.phase = None
        self.killed = False


def build_deliveries(rng, n_messages, accounts, patterns=("inbox", "2pc")):
    msgs = []
    for i in range(n_messages):
        cents = rng.randint(1, 250000)
        msgs.append({
            "m": "pay-%06d" % i,
            "p": patterns[i % len(patterns)],
            "a": "%d.%02d" % (cents // 100, cents % 100),
            "acct": rng.randrange(accounts),
        })
    # Copies of a message arrive close together (so that duplicates race each other)
    # and some arrive much later (so that they replay a completed key).
    stream = []
    group = 6
    late = []
    for g in range(0, n_messages, group):
        window = []
        for m in msgs[g:g + group]:
            for _ in range(rng.randint(2, 5)):
                (late if rng.random() < 0.1 else window).append(m)
        rng.shuffle(window)
        stream.extend(window)
    for m in late:
        stream.insert(rng.randrange(len(stream) + 1), m)
    return msgs, stream


def setup_batch_tables(c, accounts, citus):
    """The batch pattern's own accounts, and its applied rows (no unique constraint: a
    double application would show as a second row); Citus tables under --citus, as the
    other patterns' tables are."""
    c.execute("CREATE TABLE batch_accounts (id int PRIMARY KEY, balance numeric(18,2) NOT NULL)")
    c.execute("INSERT INTO batch_accounts SELECT g, 1000000000.00 FROM generate_series(0, %s) g"
              % (accounts - 1))
    c.execute("CREATE TABLE batch_applied (msg text, token uuid, amount numeric(18,2))")
    c.execute("GRANT SELECT, UPDATE ON batch_accounts TO %s" % APP_ROLE)
    c.execute("GRANT INSERT ON batch_applied TO %s" % APP_ROLE)
    if citus:
        for table in ("batch_accounts", "batch_applied"):
            c.execute("SELECT citus_add_local_table_to_metadata(%s)", (table,))


def run_main(args):
    import psycopg

    rng = random.Random(args.seed)
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    if os.path.exists(os.path.join(workdir, "data")):
        shutil.rmtree(os.path.join(workdir, "data"))
    extlog = os.path.join(workdir, "external_calls.log")
    open(extlog, "w").close()

    cluster = CitusCluster(workdir, args.port) if args.citus else Cluster(workdir, args.port)
    # The portable edition (portable/): a server without the C++ library, the edition
    # installed by psql -f of its one script.
    cluster.init(["shared_preload_libraries = ''"] if args.portable else [])
    cluster.start()
    bouncer = None
    results = []

    def check(ok, what):
        results.append((bool(ok), what))
        print("%s - %s" % ("ok" if ok else "not ok", what), flush=True)

    consumers = {}
    try:
        admin_dsn = "host=%s port=%d user=postgres dbname=postgres" % (workdir, args.port)
        with psycopg.connect(admin_dsn, autocommit=True) as c:
            c.execute("CREATE DATABASE chaos")
        if args.citus:
            cluster.prepare(psycopg, "chaos")
        dsn = "host=%s port=%d user=postgres dbname=chaos" % (workdir, args.port)
        with psycopg.connect(dsn, autocommit=True) as c:
            if args.portable:
                cluster.as_pg(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", workdir, "-p", str(args.port),
                               "-U", "postgres", "-d", "chaos", "-f", args.portable])
            elif not args.citus:
                c.execute("CREATE EXTENSION idempotency")
            c.execute("CREATE TABLE accounts (id int PRIMARY KEY, balance numeric(18,2) NOT NULL)")
            c.execute("INSERT INTO accounts SELECT g, 1000000000.00 FROM generate_series(0, %s) g"
                      % (args.accounts - 1))
            # No unique constraint: a double application would show as a second row.
            c.execute("CREATE TABLE inbox_applied (msg text, token uuid, amount numeric(18,2))")
            c.execute("CREATE TABLE twophase_done (msg text, token uuid, UNIQUE (msg, token))")
            # The consumers' application role: the one grant the README asks for, and the
            # business tables.
            c.execute("CREATE ROLE %s LOGIN" % APP_ROLE)
            c.execute("GRANT USAGE ON SCHEMA idempotency TO %s" % APP_ROLE)
            c.execute("GRANT SELECT, UPDATE ON accounts TO %s" % APP_ROLE)
            c.execute("GRANT INSERT ON inbox_applied, twophase_done TO %s" % APP_ROLE)
            if args.citus:
                # Citus tables, so that Citus commits the effect and the key (on a worker)
                # together with two-phase commit; a plain table's write would commit after
                # a one-phase COMMIT of the key on the worker (docs/design.md, "Citus").
                for table in ("accounts", "inbox_applied", "twophase_done"):
                    c.execute("SELECT citus_add_local_table_to_metadata(%s)", (table,))
        consumer_dsn = "host=%s port=%d user=%s dbname=chaos" % (workdir, args.port, APP_ROLE)
        if args.pgbouncer:
            bouncer = PgBouncer(workdir, args.port + 1, args.port)
            bouncer.start()
            consumer_dsn = "host=%s port=%d user=%s dbname=chaos" % (workdir, args.port + 1, APP_ROLE)

        if "batch" in args.patterns:
            with psycopg.connect(dsn, autocommit=True) as c:
                setup_batch_tables(c, args.accounts, args.citus)
        msgs, stream = build_deliveries(rng, args.messages, args.accounts, args.patterns)
        by_id = {m["m"]: m for m in msgs}
        ready = collections.deque()
        for i, m in enumerate(stream):
            ready.append(dict(m, d=i))
        delayed = []  # heap of (due, seq, delivery)
        seq = 0
        total_copies = len(stream)

        sel = selectors.DefaultSelector()
        argv_base = [sys.executable, os.path.abspath(__file__), "consumer", "--dsn", consumer_dsn,
                     "--extlog", extlog, "--sabotage", args.sabotage]
        next_cid = 0

        def spawn():
            nonlocal next_cid
            c = Consumer(next_cid, argv_base)
            next_cid += 1
            consumers[c.cid] = c
            sel.register(c.proc.stdout, selectors.EVENT_READ, c)
            return c

        for _ in range(args.consumers):
            spawn()

        f = collections.Counter()          # figures
        kills = []                         # (msg, pattern, last phase)
        window_events = collections.Counter()  # msg -> times a lease was lost after the call
        bad = []                           # unexpected things seen by consumers
        acked = 0
        dispatched = 0
        outcomes_by_msg = collections.defaultdict(collections.Counter)
        kill_p = args.kill_probability
        kills_by_phase = collections.Counter()
        crash_at = sorted(rng.uniform(0.2, 0.8) for _ in range(args.crashes))
        crashes_done = 0
        start = time.time()
        tampered_phase = False
        expected_mismatch = 0

        def dispatch(c):
            nonlocal dispatched
            if c.inflight is not None or c.killed:
                return
            now = time.time()
            while delayed and delayed[0][0] <= now:
                ready.append(heapq.heappop(delayed)[2])
            if not ready:
                return
            d = ready.popleft()
            if d["p"] == "batch":
                d = take_batch(d)
                f["batches"] += 1
                f["batch_deliveries"] += len(d)
                dispatched += len(d) - 1
            c.inflight = d
            c.phase = None
            dispatched += 1
            try:
                c.proc.stdin.write((json.dumps(d) + "\n").encode())
            except BrokenPipeError:
                pass

        def take_batch(first):
            """A batch: `first` and the next deliveries of the batch pattern, up to
            --batch-size (the others keep their place in the queue)."""
            batch = [first]
            others = []
            while ready and len(batch) < args.batch_size:
                d = ready.popleft()
                (batch if d["p"] == "batch" else others).append(d)
            ready.extendleft(reversed(others))
            return batch

        def take_acked(c, did):
            """The delivery `did` in flight at consumer c, now acknowledged (None if it is not
            in flight)."""
            if isinstance(c.inflight, list):
                for i, d in enumerate(c.inflight):
                    if d["d"] == did:
                        del c.inflight[i]
                        if not c.inflight:
                            c.inflight = None
                        return d
                return None
            d = c.inflight
            c.inflight = None
            return d if d is not None and d["d"] == did else None

        def requeue(d, delay):
            nonlocal seq
            seq += 1
            heapq.heappush(delayed, (time.time() + delay, seq, d))

        def handle_line(c, line):
            nonlocal acked
            parts = line.split(" ")
            if parts[0] == "P":
                c.phase = parts[1]
                return parts[1]
            if parts[0] == "E":
                f["event_" + parts[1]] += 1
                if parts[1] == "lease_lost_after_call":
                    window_events[parts[2]] += 1
                if parts[1] in ("bad_replay", "bad_complete_keys") or parts[1].startswith("unexpected_error"):
                    bad.append(line)
                return None
            if parts[0] == "A":
                d = take_acked(c, int(parts[1]))
                outcome, detail = parts[2], parts[3]
                if d is None:
                    bad.append("ack for a delivery not in flight: " + line)
                    return None
                f["outcome_" + outcome] += 1
                outcomes_by_msg[d["m"]][outcome] += 1
                if outcome == "applied":
                    f["applied_" + detail] += 1
                if outcome == "retry":
                    # in_progress: deliver again after retry_after (capped for the run).
                    requeue(d, min(float(detail), 2.5))
                else:
                    if d.get("tampered") and outcome != "mismatch":
                        bad.append("tampered delivery got %s: %s" % (outcome, d["m"]))
                    if outcome == "mismatch" and not d.get("tampered"):
                        bad.append("untampered delivery got mismatch: " + d["m"])
                    acked += 1
                return None
            bad.append("unexpected line from consumer: " + line)
            return None

        def drain(c):
            """Reads what a consumer wrote; returns False at EOF."""
            try:
                chunk = os.read(c.proc.stdout.fileno(), 65536)
            except OSError:
                chunk = b""
            if not chunk:
                return False
            c.buf += chunk
            while b"\n" in c.buf:
                raw, c.buf = c.buf.split(b"\n", 1)
                ph = handle_line(c, raw.decode())
                if (ph in KILL_PHASES and not c.killed and not tampered_phase
                        and kills_left[0] > 0 and rng.random() < kill_p.get(ph, 0)):
                    c.killed = True
                    kills_left[0] -= 1
                    os.kill(c.proc.pid, signal.SIGKILL)
                elif (ph in KILL_PHASES and not c.killed and not tampered_phase and c.cid not in stalled
                        and stalls_left[0] > 0 and rng.random() < args.stall_rate):
                    # A pause longer than the lease (a GC pause, a partition): others
                    # reclaim the key meanwhile; the holder must be fenced when it wakes.
                    stalls_left[0] -= 1
                    stalled[c.cid] = time.time() + rng.uniform(3.0, 4.5)
                    stalls_by_phase[ph] += 1
                    os.kill(c.proc.pid, signal.SIGSTOP)
            return True

        def reap(c):
            """The consumer's process ended: account for it, redeliver, replace it."""
            sel.unregister(c.proc.stdout)
            c.proc.wait()
            err = c.proc.stderr.read().decode(errors="replace")
            del consumers[c.cid]
            if c.killed:
                d = c.inflight if c.inflight is not None else None
                if isinstance(d, list):
                    # A batch: one kill, of one transaction (named by its first delivery).
                    d = d[0]
                # The last phase the consumer reported before it died.
                if d is not None:
                    kills.append((d["m"], d["p"], c.phase))
                    kills_by_phase[c.phase] += 1
                else:
                    kills_by_phase["between_deliveries"] += 1
            else:
                bad.append("consumer %d exited with %s: %s" % (c.cid, c.proc.returncode, err[-2000:]))
            if c.inflight is not None:
                # At-least-once: an unacknowledged delivery is delivered again (each one of
                # a batch).
                for d in c.inflight if isinstance(c.inflight, list) else [c.inflight]:
                    f["redelivered_after_kill"] += 1
                    requeue(d, 0.0)
            spawn()

        kills_left = [args.max_kills]
        stalls_left = [args.max_stalls]
        stalled = {}                       # cid -> when to resume
        stalls_by_phase = collections.Counter()
        total_expected = total_copies
        last_progress = time.time()
        while True:
            if acked >= total_expected and not tampered_phase:
                # Finally: copies of completed messages with a changed amount (same key,
                # different request) must all be rejected as mismatch.
                tampered_phase = True
                for m in rng.sample(msgs, min(args.tampered, len(msgs))):
                    t = dict(m, d=len(stream) + expected_mismatch, tampered=True)
                    t["a"] = str(D(m["a"]) + D("0.01"))
                    ready.append(t)
                    expected_mismatch += 1
                total_expected += expected_mismatch
            if acked >= total_expected and not stalled:
                break
            if crashes_done < len(crash_at) and acked >= crash_at[crashes_done] * total_copies:
                victim = cluster.crash()
                time.sleep(0.3)
                cluster.start()
                crashes_done += 1
                print("# %s crashed (immediate stop) and restarted after %d acks" % (victim, acked),
                      flush=True)
            for cid, due in list(stalled.items()):
                if time.time() >= due:
                    del stalled[cid]
                    if cid in consumers:
                        os.kill(consumers[cid].proc.pid, signal.SIGCONT)
            for c in list(consumers.values()):
                dispatch(c)
            for key, _ in sel.select(timeout=0.05):
                c = key.data
                if not drain(c):
                    reap(c)
                else:
                    last_progress = time.time()
            if time.time() - last_progress > 120:
                bad.append("no progress for 120 s")
                break
            if time.time() - start > args.timeout:
                bad.append("timed out after %d s" % args.timeout)
                break
        elapsed = time.time() - start

        for c in list(consumers.values()):
            c.proc.stdin.close()
        for c in list(consumers.values()):
            try:
                c.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait()
        consumers.clear()

        # ------------------------------------------------------------------ checks
        inbox_msgs = [m for m in msgs if m["p"] == "inbox"]
        tp_msgs = [m for m in msgs if m["p"] == "2pc"]
        batch_msgs = [m for m in msgs if m["p"] == "batch"]
        with psycopg.connect(dsn, autocommit=True) as c:
            balances = dict(c.execute("SELECT id, balance FROM accounts").fetchall())
            applied = c.execute("SELECT msg, count(*) FROM inbox_applied GROUP BY msg").fetchall()
            done = c.execute("SELECT msg, count(DISTINCT token) FROM twophase_done GROUP BY msg").fetchall()
            # owner::text: by the role's name, which Citus' workers resolve to their own OIDs.
            keys = c.execute("SELECT scope, key, status::text, attempts FROM idempotency.idempotency_keys"
                             " WHERE owner::text = %s", (APP_ROLE,)).fetchall()
            other_owners = c.execute("SELECT count(*) FROM idempotency.idempotency_keys"
                                     " WHERE owner::text <> %s", (APP_ROLE,)).fetchone()[0]
            stats = None if args.portable else c.execute(
                "SELECT claimed, reclaimed, replayed, in_progress, mismatched, completed"
                " FROM idempotency.idempotency_stats WHERE datname = 'chaos'").fetchone()
            if batch_msgs:
                batch_balances = dict(c.execute("SELECT id, balance FROM batch_accounts").fetchall())
                batch_applied = dict(c.execute("SELECT msg, count(*) FROM batch_applied GROUP BY msg").fetchall())

        def check_applied(label, pattern_msgs, balances, applied_counts):
            """A pattern that debits accounts and records each application: every account's
            debit to the cent, and each message applied exactly once. Returns (debited,
            expected, messages applied twice, whether some account's debit is off)."""
            expected = collections.defaultdict(D)
            for m in pattern_msgs:
                expected[m["acct"]] += D(m["a"])
            debited = {a: D("1000000000.00") - balances[a] for a in balances}
            total_expected = sum(expected.values(), D(0))
            total_debited = sum(debited.values(), D(0))
            debit_off = any(debited[a] != expected.get(a, D(0)) for a in debited)
            check(not debit_off,
                  "%s: every account's debit equals the sum of its unique messages to the cent "
                  "(%s debited, %s expected)" % (label, total_debited, total_expected))
            double = sum(1 for m in pattern_msgs if applied_counts.get(m["m"], 0) > 1)
            missing = sum(1 for m in pattern_msgs if applied_counts.get(m["m"], 0) == 0)
            check(double == 0 and missing == 0 and len(applied_counts) == len(pattern_msgs),
                  "%s: each of %d messages applied exactly once (double %d, missing %d)"
                  % (label, len(pattern_msgs), double, missing))
            return total_debited, total_expected, double, debit_off

        check(bad == [], "consumers saw nothing unexpected%s" % ("" if not bad else ": " + "; ".join(bad[:5])))
        total_debited, total_expected_debit, inbox_double, inbox_debit_off = check_applied(
            "inbox", inbox_msgs, balances, dict(applied))

        done_counts = dict(done)
        tp_double = sum(1 for m in tp_msgs if done_counts.get(m["m"], 0) > 1)
        tp_missing = sum(1 for m in tp_msgs if done_counts.get(m["m"], 0) == 0)
        check(tp_double == 0 and tp_missing == 0,
              "two-phase: each of %d messages completed exactly once (by two claims: %d, never: %d)"
              % (len(tp_msgs), tp_double, tp_missing))

        batch_double = 0
        batch_debit_off = False
        if batch_msgs:
            batch_total_debited, batch_total_expected, batch_double, batch_debit_off = check_applied(
                "batch", batch_msgs, batch_balances, batch_applied)
            batch_kills = collections.Counter(ph for _, p, ph in kills if p == "batch" and ph in BATCH_PHASES)
            check(sum(batch_kills.values()) > 0 or args.max_kills == 0,
                  "batch: consumers killed inside the batch transaction: %d %s"
                  % (sum(batch_kills.values()), dict(sorted(batch_kills.items()))))

        check(other_owners == 0, "every key belongs to the consumers' role %s (%d others)" % (APP_ROLE, other_owners))
        key_state = {(s, k): (st, att) for s, k, st, att in keys}
        processing = sum(1 for st, _ in key_state.values() if st == "processing")
        check(processing == 0, "no key is left processing (%d)" % processing)
        all_done = all(key_state.get((m["p"], m["m"]), ("", 0))[0] == "completed" for m in msgs)
        check(all_done, "every message's key is completed")

        held_kills = [k for k in kills if k[1] == "2pc" and k[2] in HELD_PHASES]
        not_reclaimed = [m for m, _, _ in held_kills if key_state.get(("2pc", m), ("", 0))[1] < 2]
        check(not not_reclaimed,
              "two-phase: each of %d claims held by a killed consumer was reclaimed and completed%s"
              % (len(held_kills), "" if not not_reclaimed else " (not: %s)" % not_reclaimed[:5]))

        calls = collections.Counter()
        with open(extlog) as fh:
            for line in fh:
                calls[line.split(" ")[0]] += 1
        window_kills = collections.Counter(m for m, p, ph in kills if p == "2pc" and ph in WINDOW_PHASES)
        after_checkpoint_kills = [m for m, p, ph in kills if p == "2pc" and ph in ("checkpointed", "completing")]
        repeated = 0
        unexplained = []
        never_called = []
        for m in tp_msgs:
            n = calls.get(m["m"], 0)
            if n == 0:
                never_called.append(m["m"])
            allowed = 1 + window_kills[m["m"]] + window_events[m["m"]]
            if n > allowed:
                unexplained.append((m["m"], n))
            repeated += max(0, n - 1)
        check(not never_called, "two-phase: every message's external call was made (missing: %d)"
              % len(never_called))
        check(not unexplained,
              "two-phase: an external call is repeated only after a crash or lost lease between the "
              "call and its checkpoint (unexplained: %s)" % (unexplained[:5] or "none"))
        repeated_after_checkpoint = sum(max(0, calls.get(m, 0) - 1 - window_kills[m] - window_events[m])
                                        for m in after_checkpoint_kills)
        check(repeated_after_checkpoint == 0,
              "two-phase: %d kills after the checkpoint repeated %d external calls (recovery_point)"
              % (len(after_checkpoint_kills), repeated_after_checkpoint))

        mismatches = f["outcome_mismatch"]
        check(mismatches == expected_mismatch,
              "%d of %d tampered duplicates rejected as mismatch" % (mismatches, expected_mismatch))
        check(crashes_done >= min(1, args.crashes), "%d server crash(es) survived" % crashes_done)
        check(len(kills) >= min(args.max_kills, 5),
              "consumers killed mid-delivery: %d" % len(kills))
        reclaimed_keys = sum(1 for st, att in key_state.values() if att >= 2)
        # Only two-phase claims outlive their transaction: inbox and batch claims that die
        # roll back with it.
        check(reclaimed_keys > 0 or args.max_kills == 0 or not tp_msgs,
              "lease expiry led to reclaims: %d keys reclaimed%s"
              % (reclaimed_keys, "" if tp_msgs else " (no two-phase messages in this run)"))

        signals = []
        for path in cluster.logs():
            with open(path, errors="replace") as fh:
                signals += [l for l in fh.read().splitlines() if "terminated by signal" in l or "PANIC" in l]
        check(not signals, "server log%s no backend terminated by a signal and no PANIC%s"
              % (" of every node has" if args.citus else " has", "" if not signals else ": " + signals[0]))

        valgrind_checks(check, workdir)

        double_effects = inbox_double + tp_double + len(unexplained) + inbox_debit_off
        double_effects += batch_double + batch_debit_off
        print("#")
        print("# figures (%s%s, seed %s, %.1f s)" % ("through PgBouncer, " if args.pgbouncer else
                                                    "Citus: coordinator + 2 workers, " if args.citus else "",
                                                    "%d consumers" % args.consumers, args.seed, elapsed))
        print("#   messages                 %d (%d inbox, %d two-phase%s)" % (len(msgs), len(inbox_msgs), len(tp_msgs),
                                                                      ", %d batch" % len(batch_msgs) if batch_msgs else ""))
        print("#   copies sent by producer  %d (each message 2-5 times) + %d tampered" % (total_copies, expected_mismatch))
        print("#   deliveries               %d (incl. %d redeliveries after a kill, %d after in_progress)"
              % (dispatched, f["redelivered_after_kill"], f["outcome_retry"]))
        print("#   applied (claimed/reclaimed)  %d / %d" % (f["applied_claimed"], f["applied_reclaimed"]))
        print("#   duplicates rejected      %d replay, %d in_progress, %d mismatch%s"
              % (f["outcome_replay"], f["outcome_retry"], mismatches,
                 ", %d in the same batch" % f["outcome_duplicate"] if batch_msgs else ""))
        print("#   consumers killed         %d  %s" % (sum(kills_by_phase.values()),
                                                      dict(sorted(kills_by_phase.items()))))
        print("#   consumers paused > lease %d  %s" % (sum(stalls_by_phase.values()), dict(sorted(stalls_by_phase.items()))))
        print("#   server crashes survived  %d%s" % (crashes_done, "" if not args.citus else
                                                      "  %s" % dict(sorted(cluster.crashed.items()))))
        print("#   connection losses        %d" % f["event_connection_lost"])
        print("#   keys reclaimed           %d (resumed from 'charged': %d; fenced late holders: %d)"
              % (reclaimed_keys, f["event_resumed_from_charged"], f["event_fenced"]))
        print("#   external calls repeated  %d (%d kills and %d leases lost to a pause or a slow reconnect"
              " between call and checkpoint;"
              " %d kills after the checkpoint repeated nothing)"
              % (repeated, sum(window_kills.values()), sum(window_events.values()), len(after_checkpoint_kills)))
        print("#   inbox debited            %s (expected %s)" % (total_debited, total_expected_debit))
        if batch_msgs:
            print("#   batches                  %d of up to %d deliveries (mean %.1f); %d later copies in the"
                  " same batch acknowledged as duplicates; %d batch transactions killed"
                  % (f["batches"], args.batch_size, f["batch_deliveries"] / max(1, f["batches"]),
                     f["outcome_duplicate"], sum(batch_kills.values())))
            print("#   batch debited            %s (expected %s)" % (batch_total_debited, batch_total_expected))
        if stats:
            print("#   idempotency_stats since last restart: claimed %s reclaimed %s replayed %s "
                  "in_progress %s mismatched %s completed %s" % stats)
        print("#   double effects           %d" % double_effects)
        check(double_effects == 0, "double effects: %d" % double_effects)
    finally:
        for c in list(consumers.values()):
            try:
                c.proc.kill()
                c.proc.wait()
            except Exception:
                pass
        if bouncer:
            bouncer.stop()
        cluster.stop()

    passed = sum(1 for ok, _ in results if ok)
    failed = len(results) - passed
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--workdir", required=True)
    r.add_argument("--port", type=int, default=5470)
    r.add_argument("--messages", type=int, default=500)
    r.add_argument("--consumers", type=int, default=8)
    r.add_argument("--accounts", type=int, default=16)
    r.add_argument("--crashes", type=int, default=1)
    r.add_argument("--max-kills", type=int, default=40)
    r.add_argument("--kill-rate", type=float, default=0.04,
                   help="probability of a kill at each reported kill phase")
    r.add_argument("--batch-kill-rate", type=float, default=0.1,
                   help="the same at each phase inside a batch transaction (reported once per batch "
                        "instead of once per delivery)")
    r.add_argument("--max-stalls", type=int, default=8,
                   help="consumers paused (SIGSTOP) for longer than the lease, then resumed")
    r.add_argument("--stall-rate", type=float, default=0.02)
    r.add_argument("--tampered", type=int, default=20)
    r.add_argument("--timeout", type=int, default=600)
    r.add_argument("--pgbouncer", action="store_true")
    r.add_argument("--portable", default="",
                   help="the portable edition's install script (psql -f) instead of CREATE EXTENSION")
    r.add_argument("--patterns", default="inbox,2pc",
                   help="comma-separated patterns the messages take in turn: inbox, 2pc, batch "
                        "(default inbox,2pc)")
    r.add_argument("--batch-size", type=int, default=20,
                   help="most deliveries the broker hands a batch consumer at once (default 20)")
    r.add_argument("--citus", action="store_true",
                   help="a Citus coordinator and two workers on ports P, P+1, P+2; --crashes "
                        "crash a worker and the coordinator in turn")
    r.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help="random seed (default %d: the same run every day)" % DEFAULT_SEED)
    sabotage_help = ("self-test of the harness: consumers with a deliberate bug, so that the "
                     "checks must fail: 'debit-on-replay' (inbox), 'ignore-recovery-point' (two-phase) "
                     "or 'apply-batch-duplicates' (batch: also applies later copies of a key in the batch)")
    r.add_argument("--sabotage", default="none",
                   choices=("none", "debit-on-replay", "ignore-recovery-point", "apply-batch-duplicates"),
                   help=sabotage_help)
    c = sub.add_parser("consumer")
    c.add_argument("--dsn", required=True)
    c.add_argument("--extlog", required=True)
    c.add_argument("--sabotage", default="none")
    args = ap.parse_args()
    if args.cmd == "consumer":
        consumer_main(args)
        return 0
    args.patterns = tuple(args.patterns.split(","))
    if not args.patterns or any(p not in PATTERNS for p in args.patterns) or args.batch_size < 1:
        ap.error("--patterns takes a comma-separated list of %s; --batch-size at least 1" % ", ".join(PATTERNS))
    print("# seed %d (replay with --seed %d)" % (args.seed, args.seed), flush=True)
    args.kill_probability = {p: args.batch_kill_rate if p in BATCH_PHASES else args.kill_rate
                             for p in KILL_PHASES}
    return run_main(args)


if __name__ == "__main__":
    sys.exit(main())
