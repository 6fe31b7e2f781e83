#!/usr/bin/python3
"""A worker lost between PREPARE and COMMIT PREPARED: Citus' recovery commits the prepared
transaction, and the key and the effect land together (test/suites/citus.sh starts the nodes).

  two_phase_recovery.py COORDINATOR_PORT WORKER_PORT WORKER_PORT PROXY_PORT DATADIR_PATTERN

The coordinator knows the first worker only through a TCP relay of this script on PROXY_PORT
(the nodes talk without TLS for this, citus.node_conninfo = 'sslmode=disable'), so the script
sees every statement the coordinator sends it. Armed, the relay cuts the connection when it
sees COMMIT PREPARED: the fault point is a statement, not a moment, so the run is the same
every time. An inbox transaction (claim_key on the worker's shard, the effect in a table of
the coordinator, complete_key) commits on the coordinator and stays prepared on the worker;
the worker then crashes (immediate stop) and starts again. Until recovery another claim of
the key answers in_progress (the prepared transaction holds the row), and after
recover_prepared_transactions() it answers replay with the stored response, and the effect is
there once. Prints "ok" / "not ok" lines, then "N passed, N failed".
"""
import os
import socket
import subprocess
import sys
import threading

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from tap_count import check, finish  # noqa: E402

HOST = "127.0.0.1"
coordinator_port, worker_port, other_port, proxy_port = (int(p) for p in sys.argv[1:5])
datadir_pattern = sys.argv[5]


class Relay(threading.Thread):
    """Forwards PROXY_PORT to the worker; while armed, cuts a connection that carries
    COMMIT PREPARED before the statement reaches the worker."""

    def __init__(self):
        super().__init__(daemon=True)
        self.armed = threading.Event()
        self.cuts = 0
        self.listener = socket.create_server((HOST, proxy_port))

    def run(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((HOST, worker_port))
            except OSError:  # the worker is down (its crash below): the client sees a refusal
                client.close()
                continue
            threading.Thread(target=self.pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self.pipe, args=(server, client, False), daemon=True).start()

    def pipe(self, source, sink, to_worker):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if to_worker and self.armed.is_set() and b"COMMIT PREPARED" in data:
                    self.cuts += 1
                    break
                sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def connect(port, user="postgres"):
    return psycopg.connect("host=%s port=%d user=%s dbname=postgres" % (HOST, port, user), autocommit=True)


def pg_ctl(*args):
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    subprocess.run(as_postgres + [os.environ["PG_CTL"], "-D",
                    datadir_pattern.format(port=worker_port)] + list(args),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main():
    relay = Relay()
    relay.start()
    admin = connect(coordinator_port)
    admin.execute("SELECT citus_set_coordinator_host(%s, %s)", (HOST, coordinator_port))
    admin.execute("SELECT citus_add_node(%s, %s)", (HOST, proxy_port))
    admin.execute("SELECT citus_add_node(%s, %s)", (HOST, other_port))
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "setup.sql")) as f:
        admin.execute(f.read())
    admin.execute("CREATE ROLE two_phase_app LOGIN")
    admin.execute("GRANT USAGE ON SCHEMA idempotency TO two_phase_app")
    admin.execute("CREATE TABLE two_phase_effects (key text NOT NULL)")
    admin.execute("SELECT citus_add_local_table_to_metadata('two_phase_effects')")
    admin.execute("GRANT INSERT, SELECT ON two_phase_effects TO two_phase_app")

    # A key whose shard is on the relayed worker.
    key = next(k for k in ("order-%d" % i for i in range(1000)) if admin.execute(
        "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid ="
        " get_shard_id_for_distribution_column('idempotency.idempotency_keys', %s::text)", (k,)).fetchone()[0]
        == proxy_port)

    app = connect(coordinator_port, "two_phase_app")
    relay.armed.set()
    committed = True
    try:
        with app.transaction():
            token = app.execute("SELECT token FROM idempotency.claim_key(%s::text)", (key,)).fetchone()[0]
            app.execute("INSERT INTO two_phase_effects VALUES (%s)", (key,))
            app.execute("SELECT idempotency.complete_key(%s::text, %s::uuid, '{\"paid\": true}'::jsonb, 201)",
                        (key, token))
    except psycopg.Error as e:
        committed = False
        print("# the commit failed: %s %s" % (e.sqlstate, str(e).strip()))
    relay.armed.clear()
    check("the relay cut the worker's connection at COMMIT PREPARED (%d cut)" % relay.cuts, relay.cuts >= 1)
    check("the transaction committed on the coordinator (the commit point is its own commit)", committed)

    with connect(worker_port) as worker:
        prepared = worker.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
    check("the worker holds the transaction prepared (%d)" % prepared, prepared == 1)

    pg_ctl("stop", "-m", "immediate", "-w")
    pg_ctl("start", "-w", "-l", datadir_pattern.format(port=worker_port) + "/../restart.log")
    with connect(worker_port) as worker:
        prepared = worker.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
    check("after the worker's crash and restart the transaction is still prepared", prepared == 1)

    other = connect(coordinator_port, "two_phase_app")
    status = other.execute("SELECT status::text FROM idempotency.claim_key(%s::text)", (key,)).fetchone()[0]
    check("before recovery another claim of the key answers in_progress (got %s)" % status,
          status == "in_progress")

    # The coordinator's cached connection to the worker died with it: Citus says so once
    # (XX000, libpq's words), and the next statement connects afresh.
    recovered = None
    for _ in range(5):
        try:
            recovered = admin.execute("SELECT recover_prepared_transactions()").fetchone()[0]
            break
        except psycopg.Error as e:
            print("# recover_prepared_transactions() again after %s: %s" % (e.sqlstate, str(e).strip()))
    check("recover_prepared_transactions() committed it (%s)" % recovered, recovered == 1)
    status, response, code = other.execute(
        "SELECT status::text, response, response_code FROM idempotency.claim_key(%s::text)", (key,)).fetchone()
    check("after recovery the key answers replay with the stored response (got %s %s %s)" % (status, response, code),
          status == "replay" and response == {"paid": True} and code == 201)
    effects = admin.execute("SELECT count(*) FROM two_phase_effects WHERE key = %s", (key,)).fetchone()[0]
    check("the effect is there once (%d)" % effects, effects == 1)


try:
    main()
except psycopg.Error as e:
    check("the run reached its end", False, "%s: %s" % (e.sqlstate, str(e).strip()))
finish()
