#!/usr/bin/python3
"""Keys keep their owner when Citus moves their shards (test/suites/citus.sh starts the nodes).

  shard_move.py COORDINATOR_PORT WORKER_PORT WORKER_PORT SPARE_PORT SPARE_PORT

The coordinator and the two workers form a cluster with the Citus recipe applied
(test/citus/setup.sql); the two spare nodes run Citus but are not in the cluster yet. Three
roles, whose OIDs differ from node to node, hold keys in every state: completed (with a
response as sent), held with a long lease, released, checkpointed, expired, expired and
claimed again; some key names are held by two or three roles. Then every placement of the
second worker moves to the first spare node (logical replication), and the rebalancer
spreads the shards over the second spare node once it is added (block_writes: COPY). After
each move every role asks for every key name, in a transaction it rolls back: its own keys
answer what they answered before, a name it does not hold is a fresh `claimed` of its own;
the rows are unchanged and the nodes' shards hold them all, once; the holders' tokens still
complete their own keys and no other role's. The nodes run no cleanup worker (citus.sh), so
the expired rows move too and no cleanup round races a claim. Prints one "ok" / "not ok"
line per assertion, then "N passed, N failed".
"""
import os
import sys
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from tap_count import check, finish  # noqa: E402

HOST = "127.0.0.1"
ports = [int(p) for p in sys.argv[1:6]]
coordinator_port, worker_ports, spare_ports = ports[0], ports[1:3], ports[3:5]
source_port, move_target_port, rebalance_port = worker_ports[1], spare_ports[0], spare_ports[1]
ROLES = ["alice", "bob", "carol"]
# Key names per state; role i holds the names whose number n has n % (i + 1) == 0, so alice
# holds all of them, bob every second, carol every third: names held by one, two and three
# roles, and names another role can claim afresh.
STATES = ["done", "held", "released", "checkpointed", "expired", "reclaimed"]
NAMES = ["%s-%d" % (state, n) for state in STATES for n in range(6)]


def connect(port, user="postgres"):
    return psycopg.connect("host=%s port=%d user=%s dbname=postgres" % (HOST, port, user), autocommit=True)


def holds(role, name):
    return int(name.rsplit("-", 1)[1]) % (ROLES.index(role) + 1) == 0


def fingerprint(role, name):
    # Each role sends its own payload: a row answered to the wrong role would be a mismatch.
    return ("%s:%s" % (role, name)).encode()


CLAIM = ("SELECT status::text, token, response, response_code, response_body, response_headers,"
         " fingerprint, recovery_point, attempts, created_at, expires_at"
         " FROM idempotency.claim_key(%s::text, %s::bytea, ''::text, %s::interval, %s::interval)")


def claim(conn, role, name, ttl=None, lease=None):
    return conn.execute(CLAIM, (name, fingerprint(role, name), ttl, lease)).fetchone()


def answer(conn, role, name):
    """What role's claim of name answers, in a transaction rolled back: the parts of the
    answer that stay put (not the new token, nor a fresh claim's times)."""
    with conn.transaction(force_rollback=True):
        row = claim(conn, role, name)
    status, token, *rest = row
    stable = [status, token is not None] + rest
    if status in ("claimed", "reclaimed"):
        stable[-1] = None  # expires_at: now + lease
        if status == "claimed":
            stable[-2] = None  # created_at: now
    return tuple(stable)


def answers(sessions):
    return {(role, name): answer(sessions[role], role, name) for role in ROLES for name in NAMES}


def expected_status(role, name):
    if not holds(role, name):
        return "claimed"
    return {"done": "replay", "held": "in_progress", "released": "reclaimed", "checkpointed": "in_progress",
            "expired": "claimed", "reclaimed": "in_progress"}[name.rsplit("-", 1)[0]]


ROWS = ("SELECT owner, scope, key, status::text, fingerprint, attempts, ttl, lease, created_at, expires_at,"
        " lease_token, locked_until, recovery_point, response_code, response, response_body, response_headers"
        " FROM idempotency.idempotency_keys WHERE owner = ANY(%s) ORDER BY owner, key")


def local_rows(port):
    """The keys of the three roles in the shard placements on one node (its own metadata)."""
    with connect(port) as conn:
        shards = conn.execute(
            "SELECT s.shardid FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid)"
            " WHERE s.logicalrelid = 'idempotency.idempotency_keys'::regclass"
            " AND p.groupid = (SELECT groupid FROM pg_dist_local_group)").fetchall()
        return sum(conn.execute("SELECT count(*) FROM idempotency.idempotency_keys_%d WHERE owner = ANY(%%s)"
                                % shard, (ROLES,)).fetchone()[0] for (shard,) in shards)


def placements(admin, port):
    return [r[0] for r in admin.execute(
        "SELECT shardid FROM pg_dist_shard_placement WHERE nodeport = %s AND shardid IN"
        " (SELECT shardid FROM pg_dist_shard WHERE logicalrelid = 'idempotency.idempotency_keys'::regclass)"
        " ORDER BY shardid", (port,)).fetchall()]


def role_oids(port):
    with connect(port) as conn:
        return dict(conn.execute("SELECT rolname, oid::int FROM pg_roles WHERE rolname = ANY(%s)", (ROLES,)).fetchall())


def filler_roles(port, prefix, count):
    """Roles on one node only, so that the OIDs the three roles get there differ from the
    other nodes'."""
    with connect(port) as conn:
        conn.execute("SET citus.enable_create_role_propagation = off")
        for i in range(count):
            conn.execute("CREATE ROLE %s_%d NOLOGIN" % (prefix, i))


def main():
    admin = connect(coordinator_port)
    filler_roles(worker_ports[0], "filler_w1", 3)
    filler_roles(move_target_port, "filler_s1", 5)
    filler_roles(rebalance_port, "filler_s2", 7)
    for role in ROLES:
        admin.execute("CREATE ROLE %s LOGIN" % role)
    admin.execute("GRANT USAGE ON SCHEMA idempotency TO alice, bob, carol")
    sessions = {role: connect(coordinator_port, role) for role in ROLES}

    # Keys in every state, each role with its own response and payload.
    tokens = {}
    for role in ROLES:
        conn = sessions[role]
        for name in NAMES:
            if not holds(role, name):
                continue
            state = name.rsplit("-", 1)[0]
            if state == "expired" or state == "reclaimed":
                claim(conn, role, name, ttl="10 milliseconds", lease="10 milliseconds")
                continue
            token = claim(conn, role, name, lease="1 day")[1]
            tokens[(role, name)] = token
            if state == "done":
                conn.execute("SELECT idempotency.complete_key(%s::text, %s::uuid, %s::jsonb, 201, ''::text,"
                             " response_body => %s::bytea, response_headers => %s::jsonb)",
                             (name, token, '{"role": "%s", "key": "%s"}' % (role, name),
                              ("%s paid %s" % (role, name)).encode(), '{"X-Owner": "%s"}' % role))
            elif state == "released":
                conn.execute("SELECT idempotency.release_key(%s::text, %s::uuid, ''::text)", (name, token))
            elif state == "checkpointed":
                conn.execute("SELECT idempotency.checkpoint_key(%s::text, %s::uuid, %s::text, ''::text)",
                             (name, token, "step-2 of " + role))
    # Expiry is decided by the clock at the claim: wait until the short keys have expired, then
    # claim the "reclaimed" ones again (a fresh claim with a long lease).
    while admin.execute("SELECT bool_or(expires_at >= clock_timestamp()) FROM idempotency.idempotency_keys"
                        " WHERE key LIKE 'expired-%' OR key LIKE 'reclaimed-%'").fetchone()[0]:
        time.sleep(0.05)
    for role in ROLES:
        for name in NAMES:
            if holds(role, name) and name.startswith("reclaimed-"):
                status, token = claim(sessions[role], role, name, lease="1 day")[:2]
                tokens[(role, name)] = token

    before = answers(sessions)
    wrong = [(k, v[0]) for k, v in before.items() if v[0] != expected_status(*k)]
    check("before any move, each of %d (role, key name) pairs answers its state's status" % len(before),
          not wrong, wrong[:5])
    rows_before = admin.execute(ROWS, (ROLES,)).fetchall()
    total = len(rows_before)
    expected_total = sum(holds(r, n) for r in ROLES for n in NAMES)
    check("the %d keys of the three roles are stored" % expected_total, total == expected_total, total)

    def after_move(what, nodes, moved_to):
        """The assertions after one way of moving the shards."""
        now = answers(sessions)
        changed = [(k, before[k], now[k]) for k in before if now[k] != before[k]]
        check("after %s: each role's claim of each key name answers exactly as before (status, response,"
              " body, headers, fingerprint, recovery point, attempts, times)" % what, not changed, changed[:3])
        foreign = [k for k in now if not holds(*k) and now[k][0] != "claimed"]
        check("after %s: another role's claim of a name it does not hold is a fresh claimed of its own" % what,
              not foreign, foreign[:5])
        rows = admin.execute(ROWS, (ROLES,)).fetchall()
        check("after %s: every row is unchanged, owners' names included" % what, rows == rows_before,
              (len(rows), len(rows_before)))
        per_node = {port: local_rows(port) for port in nodes}
        check("after %s: the nodes' shards hold every key once (%s), some on %d" % (what, per_node, moved_to),
              sum(per_node.values()) == total and per_node[moved_to] > 0, per_node)

    # Citus gives each role another OID on each node: a row carried by its owner's OID would
    # name another role, or none, where it lands.
    admin.execute("SELECT citus_add_node(%s, %s)", (HOST, move_target_port))
    oids = {port: role_oids(port) for port in [coordinator_port] + worker_ports + [move_target_port]}
    check("the three roles' OIDs differ between the moving shards' source and target",
          all(oids[source_port][r] != oids[move_target_port][r] for r in ROLES), oids)
    moving = placements(admin, source_port)
    for shard in moving:
        admin.execute("SELECT citus_move_shard_placement(%s, %s, %s, %s, %s, shard_transfer_mode => 'force_logical')",
                      (shard, HOST, source_port, HOST, move_target_port))
    check("citus_move_shard_placement moved all %d placements of a worker (logical replication)" % len(moving),
          len(moving) > 0 and placements(admin, source_port) == [] and
          set(moving) <= set(placements(admin, move_target_port)), (moving, placements(admin, source_port)))
    admin.execute("CALL citus_cleanup_orphaned_resources()")
    after_move("citus_move_shard_placement", [coordinator_port] + worker_ports + [move_target_port], move_target_port)

    admin.execute("SELECT citus_add_node(%s, %s)", (HOST, rebalance_port))
    oids[rebalance_port] = role_oids(rebalance_port)
    check("the three roles' OIDs on the added node differ from every other node's",
          all(oids[rebalance_port][r] != oids[p][r] for r in ROLES for p in oids if p != rebalance_port), oids)
    admin.execute("SELECT citus_rebalance_start(shard_transfer_mode => 'block_writes')")
    admin.execute("SELECT citus_rebalance_wait()")
    state = admin.execute("SELECT state::text FROM pg_dist_background_job ORDER BY job_id DESC LIMIT 1").fetchone()[0]
    landed = placements(admin, rebalance_port)
    check("citus_rebalance_start moved shards onto the added node (COPY)", state == "finished" and landed,
          (state, landed))
    admin.execute("CALL citus_cleanup_orphaned_resources()")
    after_move("citus_rebalance_start", ports, rebalance_port)

    # The holders' tokens survived the moves: each completes its own key, and no other role's.
    stolen = []
    kept = []
    for (role, name), token in sorted(tokens.items()):
        if not name.startswith("held-"):
            continue
        for thief in ROLES:
            if thief != role:
                try:
                    with sessions[thief].transaction(force_rollback=True):
                        sessions[thief].execute("SELECT idempotency.complete_key(%s::text, %s::uuid, '{}'::jsonb)",
                                                (name, token))
                    stolen.append((thief, role, name))
                except psycopg.Error as e:
                    # No key of that name: P0002; the thief's own key of that name: not its token.
                    if e.sqlstate != ("55000" if holds(thief, name) else "P0002"):
                        stolen.append((thief, role, name, e.sqlstate))
        status = sessions[role].execute("SELECT status::text FROM idempotency.complete_key(%s::text, %s::uuid,"
                                        " '{}'::jsonb)", (name, token)).fetchone()[0]
        kept.append(status == "replay")
    check("after both moves, another role's completion with a holder's token fails (P0002, or 55000 for"
          " a key of its own of that name)",
          not stolen, stolen[:5])
    check("after both moves, each holder's token completes its own key (%d keys)" % len(kept),
          kept and all(kept), kept)


try:
    main()
except psycopg.Error as e:
    # A step that should have worked failed: one failure, and the run still ends with its count.
    check("the run reached its end", False, "%s: %s" % (e.sqlstate, str(e).strip()))
finish()
