#!/usr/bin/python3
"""Consumers keep answering while Citus moves shards, rebalances, drains a node and loses a
worker (test/suites/citus.sh starts the nodes).

  moves_under_load.py COORDINATOR_PORT WORKER_PORT WORKER_PORT SPARE_PORT SPARE_PORT DATADIR_PATTERN

The coordinator and the two workers form a cluster with the Citus recipe applied; the spare
nodes run Citus but are not in the cluster yet. DATADIR_PATTERN names a node's directory with
{port} in it (the crash stops and starts a worker's server there).

Two roles consume the same message ids (each message is delivered two or three times, in a
shuffled order from a fixed seed): per delivery BEGIN, claim_key through the coordinator
(delegated to the key's shard), the effect in a table of the coordinator, complete_key, COMMIT
(a transaction on two nodes: Citus commits it in two phases). A delivery that fails is
delivered again, as a broker would; `in_progress` is delivered again later. Meanwhile the main
thread moves every shard of a worker to a spare node by logical replication, back with
block_writes, adds the second spare node and rebalances, drains a worker, and crashes a
worker (immediate stop, then start). Then the consumers finish, and:
- every message's effect happened exactly once per role (0 double, 0 lost);
- every key answers `replay` to its own role, with that role's response;
- every error a consumer saw has a class a client retries (40001, 40P01, 08xxx, 57P0x, or
  Citus' own transient XX000 of a move's metadata switch, matched by its message), counted by
  SQLSTATE in the output; none is 42501 and none comes from our code.
Prints one "ok" / "not ok" line per assertion, then "N passed, N failed".
"""
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from tap_count import check, finish  # noqa: E402

HOST = "127.0.0.1"
ports = [int(p) for p in sys.argv[1:6]]
datadir_pattern = sys.argv[6]
coordinator_port, worker_ports, spare_ports = ports[0], ports[1:3], ports[3:5]
SEED = int(os.environ.get("MOVES_SEED", "20261205"))
MESSAGES = int(os.environ.get("MOVES_MESSAGES", "1500"))
CONSUMERS_PER_ROLE = 3
ROLES = ["mover_a", "mover_b"]

# Classes a client retries. Two kinds of Citus' own XX000 are transient too, matched by their
# message (no other XX000 counts): a delegated call meeting a move's metadata switch, and the
# coordinator's connection to a worker lost under a statement (libpq's words for it, which
# Citus passes on as XX000).
CITUS_TRANSIENT = ("cannot execute a distributed query from a query on a shard",
                   "SSL SYSCALL error", "server closed the connection unexpectedly",
                   "connection to the remote node", "could not establish any connections to the node",
                   "terminating connection due to administrator command")


def retryable(sqlstate, message):
    if sqlstate is None:  # the connection broke: no SQLSTATE reached the client
        return True
    if sqlstate in ("40001", "40P01") or sqlstate.startswith("08") or sqlstate.startswith("57P0"):
        return True
    return sqlstate == "XX000" and any(m in message for m in CITUS_TRANSIENT)


def connect(port, user="postgres"):
    return psycopg.connect("host=%s port=%d user=%s dbname=postgres connect_timeout=10" % (HOST, port, user),
                           autocommit=True)


class Consumer(threading.Thread):
    def __init__(self, role, deliveries, errors, lock):
        super().__init__(daemon=True)
        self.role, self.deliveries, self.errors, self.lock = role, deliveries, errors, lock
        self.conn = None
        self.done = 0

    def ensure(self):
        if self.conn is None or self.conn.closed or self.conn.broken:
            try:
                self.conn = psycopg.connect("host=%s port=%d user=%s dbname=postgres connect_timeout=10"
                                            % (HOST, coordinator_port, self.role))
            except psycopg.OperationalError as e:
                self.note(None, str(e))
                self.conn = None
                time.sleep(0.2)
                return False
        return True

    def note(self, sqlstate, message):
        with self.lock:
            self.errors.append((sqlstate, message.strip().splitlines()[0] if message else ""))

    def deliver(self, key):
        """True when the message is acknowledged (claimed and committed, or a replay)."""
        fp = ("%s:%s" % (self.role, key)).encode()
        conn = self.conn
        try:
            with conn.transaction():
                status, token, retry_after = conn.execute(
                    "SELECT status::text, token, retry_after FROM idempotency.claim_key(%s::text, %s::bytea,"
                    " ''::text, NULL::interval, '30 seconds'::interval)", (key, fp)).fetchone()
                if status in ("claimed", "reclaimed"):
                    conn.execute("INSERT INTO moves_effects (role, key) VALUES (%s, %s)", (self.role, key))
                    conn.execute("SELECT idempotency.complete_key(%s::text, %s::uuid, %s::jsonb)",
                                 (key, token, '{"by": "%s"}' % self.role))
            if status in ("claimed", "reclaimed", "replay"):
                return True
            if status == "mismatch":
                self.note("mismatch", key)
                return True
            return False  # in_progress: delivered again later
        except psycopg.Error as e:
            self.note(e.sqlstate, str(e))
            return False

    def run(self):
        pending = list(self.deliveries)
        while pending:
            key = pending.pop(0)
            if not self.ensure():
                pending.append(key)
                continue
            if self.deliver(key):
                self.done += 1
            else:
                pending.append(key)
                time.sleep(0.01)
        if self.conn is not None:
            self.conn.close()


def placements(admin, port):
    return [r[0] for r in admin.execute(
        "SELECT shardid FROM pg_dist_shard_placement WHERE nodeport = %s AND shardid IN"
        " (SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'idempotency.idempotency_keys'::regclass)"
        " ORDER BY shardid", (port,)).fetchall()]


class Admin:
    """The operator's session: a statement that fails because Citus lost a node connection (a
    class a client retries) is run again on a new connection, as an operator would."""

    def __init__(self):
        self.conn = connect(coordinator_port)

    def execute(self, sql, params=None):
        for attempt in range(20):
            try:
                return self.conn.execute(sql, params)
            except psycopg.Error as e:
                if attempt == 19 or not retryable(e.sqlstate, str(e)):
                    raise
                print("# operator retries after %s: %s" % (e.sqlstate, str(e).strip().splitlines()[0]))
                time.sleep(0.5)
                if self.conn.closed or self.conn.broken:
                    self.conn = connect(coordinator_port)


def move_all(admin, source, target, mode):
    moved = 0
    for shard in placements(admin, source):
        admin.execute("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, shard_transfer_mode => %s)",
                      (shard, HOST, source, HOST, target, mode))
        moved += 1
    admin.execute("CALL citus_cleanup_orphaned_resources()")
    return moved


def pg_ctl(port, *args):
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run(as_postgres + [os.environ["PG_CTL"], "-D",
                    datadir_pattern.format(port=port)] + list(args),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    rng = random.Random(SEED)
    print("# seed %d, %d messages, %d consumers per role" % (SEED, MESSAGES, CONSUMERS_PER_ROLE))
    admin = Admin()
    admin.execute("CREATE TABLE moves_effects (role text NOT NULL, key text NOT NULL)")
    admin.execute("SELECT citus_add_local_table_to_metadata('moves_effects')")
    for role in ROLES:
        admin.execute("CREATE ROLE %s LOGIN" % role)
        admin.execute("GRANT USAGE ON SCHEMA idempotency TO %s" % role)
        admin.execute("GRANT INSERT, SELECT ON moves_effects TO %s" % role)

    keys = ["msg-%d" % i for i in range(MESSAGES)]
    errors, lock = [], threading.Lock()
    consumers = []
    for role in ROLES:
        deliveries = [k for k in keys for _ in range(rng.choice((2, 3)))]
        rng.shuffle(deliveries)
        for c in range(CONSUMERS_PER_ROLE):
            consumers.append(Consumer(role, deliveries[c::CONSUMERS_PER_ROLE], errors, lock))
    for c in consumers:
        c.start()

    ops = Counter()
    source, target = worker_ports[1], spare_ports[0]
    admin.execute("SELECT citus_add_node(%s, %s)", (HOST, target))
    ops["logical moves"] += move_all(admin, source, target, "force_logical")
    ops["block_writes moves"] += move_all(admin, target, source, "block_writes")
    admin.execute("SELECT citus_add_node(%s, %s)", (HOST, spare_ports[1]))
    admin.execute("SELECT citus_rebalance_start()")  # auto: logical for a table with a primary key
    admin.execute("SELECT citus_rebalance_wait()")
    ops["rebalances"] += 1
    admin.execute("CALL citus_cleanup_orphaned_resources()")
    admin.execute("SELECT citus_drain_node(%s, %s)", (HOST, spare_ports[1]))
    admin.execute("CALL citus_cleanup_orphaned_resources()")
    ops["drains"] += 1
    # A worker crashes (immediate stop: no shutdown checkpoint) and comes back.
    crashed = worker_ports[0]
    pg_ctl(crashed, "stop", "-m", "immediate", "-w")
    time.sleep(0.5)
    pg_ctl(crashed, "start", "-w", "-l", datadir_pattern.format(port=crashed) + "/../restart-%d.log" % crashed)
    ops["worker crashes"] += 1
    admin.execute("SELECT recover_prepared_transactions()")
    print("# operations while the consumers ran: %s" % dict(ops))

    for c in consumers:
        c.join(timeout=600)
    alive = [c for c in consumers if c.is_alive()]
    check("every consumer acknowledged all its deliveries", not alive,
          ["%s: %d done" % (c.role, c.done) for c in alive])
    admin.execute("SELECT recover_prepared_transactions()")

    per_key = Counter(admin.execute("SELECT role, key FROM moves_effects").fetchall())
    double = [k for k, n in per_key.items() if n > 1]
    lost = [(r, k) for r in ROLES for k in keys if per_key[(r, k)] == 0]
    check("0 double effects over %d role-messages" % (len(ROLES) * MESSAGES), not double, double[:5])
    check("0 lost messages", not lost, lost[:5])

    wrong = []
    for role in ROLES:
        with psycopg.connect("host=%s port=%d user=%s dbname=postgres" % (HOST, coordinator_port, role)) as conn:
            for key in keys:
                with conn.transaction(force_rollback=True):
                    status, response = conn.execute(
                        "SELECT status::text, response FROM idempotency.claim_key(%s::text, %s::bytea)",
                        (key, ("%s:%s" % (role, key)).encode())).fetchone()
                if status != "replay" or response != {"by": role}:
                    wrong.append((role, key, status, response))
    check("every key answers replay to its own role with its own response", not wrong, wrong[:5])

    by_state = Counter(s for s, _ in errors)
    print("# errors seen by the consumers, by SQLSTATE: %s" % (dict(by_state) or "none"))
    for (state, message), n in Counter(errors).most_common():
        print("#   %4d  %s  %s" % (n, state, message[:120]))
    bad = [(s, m) for s, m in errors if s != "mismatch" and not retryable(s, m)]
    check("every error a consumer saw is of a class a client retries (%d errors)" % len(errors), not bad,
          Counter(bad).most_common(5))
    check("no 42501 for a role that has its grant", by_state["42501"] == 0, by_state["42501"])
    check("no mismatch: each role's payload met only its own keys", by_state["mismatch"] == 0)


try:
    main()
except psycopg.Error as e:
    check("the run reached its end", False, "%s: %s" % (e.sqlstate, str(e).strip()))
finish()
