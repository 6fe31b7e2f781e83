#!/usr/bin/python3
"""The broker half of clients/conformance/CONTRACT.md: a real RabbitMQ redelivers, each
message's effect happens once (issue #35).

    harness.py --lang go --amqp-url URL --database-url DSN --admin-url DSN
               [--modes single,batch,two_phase] [--messages 300] [--consumers 2] [--seed N]
               [--crash-kills 3] [--sigkills 2] [--pg-restart-cmd CMD] [--pg-restart-mode batch]
               -- CONSUMER_COMMAND [ARG...]

For each mode: a queue with a dead-letter queue (declared here), MESSAGES messages published
with publisher confirms, each one to three times (the same message_id and body), and for one
message in twenty one more publication under its id with another amount (a mismatch), all
shuffled by the seed; then CONSUMERS consumer processes at once (CONSUMER_MODE, PREFETCH,
CONSUMER_ID, IDEM_LEASE_SECONDS in their environment), restarted whenever one exits, until
every message has its effect and the queue is empty. Faults, from the seed:
  - CRASH_AFTER_COMMIT=N for the first CRASH_KILLS starts (the consumer SIGKILLs itself after
    its Nth COMMIT, before the ack: the broker redelivers what it had committed);
  - SIGKILLs from here when the effects reach given counts (single and batch modes: the
    consumer is then inside a batch or between two; two_phase: not, see below);
  - PG_RESTART_CMD once, in PG_RESTART_MODE, when half the effects are in (the consumers lose
    their connections: nack, reconnect).
Then the counts (never times): every message's effect exactly once (0 double, 0 lost), its
amount one of the bodies published under its id, every publication whose body is not the one
applied in the dead-letter queue and nothing else there, the queue empty, each graceful stop
(SIGTERM) exiting 0, every key owned by the consumer's role. Deliveries are counted by the
extension's statistics (claim answers, `idempotency_stats`, through ADMIN_URL).

two_phase: the effect commits on its own connection before complete_key; a kill between the
two is the one window two-phase leaves (docs/reliability.md), so the harness does not SIGKILL
two_phase consumers from outside; they crash after a COMMIT (the claim's or the completion's).

Prints "ok - ..." / "not ok - ..." lines, the figures, and "broker-LANG: N passed, M failed".
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time

import pika
import psycopg



class Run:
    def __init__(self, args):
        self.args = args
        self.passed = self.failed = 0
        self.rng = random.Random(args.seed)
        self.db = psycopg.connect(args.database_url, autocommit=True)
        self.admin = psycopg.connect(args.admin_url, autocommit=True)
        self.figures = {"publications": 0, "messages": 0, "deliveries": 0, "crash_kills": 0, "sigkills": 0,
                        "pg_restarts": 0, "consumer_starts": 0, "dead_lettered": 0}
        self.amqp = None
        self.channel = None

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print("ok - %s" % name, flush=True)
        else:
            self.failed += 1
            print("not ok - %s%s" % (name, ("\n    " + str(detail)[:2000]) if detail != "" else ""), flush=True)
        return ok

    # --- AMQP ---------------------------------------------------------------------------------
    def connect_amqp(self):
        if self.amqp is not None and self.amqp.is_open:
            return
        self.amqp = pika.BlockingConnection(pika.URLParameters(self.args.amqp_url))
        self.channel = self.amqp.channel()
        self.channel.confirm_delivery()

    def queue_depth(self, queue):
        """Messages ready in queue (not those delivered and unacked)."""
        for _ in range(3):
            try:
                self.connect_amqp()
                return self.channel.queue_declare(queue, passive=True).method.message_count
            except (pika.exceptions.AMQPError, OSError):
                self.amqp = None
                time.sleep(0.5)
        raise RuntimeError("cannot ask RabbitMQ for the depth of %s" % queue)

    def consumers_registered(self, queue):
        self.connect_amqp()
        return self.channel.queue_declare(queue, passive=True).method.consumer_count

    def declare(self, queue):
        self.connect_amqp()
        dlq = queue + ".dead"
        for q in (queue, dlq):
            self.channel.queue_delete(q)
        self.channel.queue_declare(dlq, durable=True)
        self.channel.queue_declare(queue, durable=True, arguments={
            "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
        return dlq

    def publish(self, queue, publications):
        self.connect_amqp()
        for seq, (mid, amount) in enumerate(publications):
            body = json.dumps({"account": "a%d" % (int(mid[-5:]) % 7), "amount": amount}).encode()
            self.channel.basic_publish("", queue, body, pika.BasicProperties(
                message_id=mid, content_type="application/json", delivery_mode=2, headers={"x-pub": seq}),
                mandatory=True)
        self.figures["publications"] += len(publications)

    def drain_dead_letters(self, dlq):
        got = []
        self.connect_amqp()
        while True:
            method, props, body = self.channel.basic_get(dlq, auto_ack=True)
            if method is None:
                return got
            got.append(((props.headers or {}).get("x-pub"), props.message_id, json.loads(body)["amount"]))

    # --- database -------------------------------------------------------------------------------
    def effects(self, prefix):
        rows = self.db.execute("SELECT message_id, count(*), min(amount), max(amount) FROM broker_effects "
                               "WHERE message_id LIKE %s GROUP BY 1", (prefix + "%",)).fetchall()
        return {mid: (n, lo, hi) for mid, n, lo, hi in rows}

    def claim_answers(self):
        row = self.admin.execute("SELECT coalesce(sum(claimed + reclaimed + replayed + in_progress + mismatched), 0) "
                                 "FROM idempotency_monitor.idempotency_stats WHERE database = "
                                 "(SELECT oid FROM pg_database WHERE datname = current_database())").fetchone()
        return int(row[0])

    def reconnect_db(self):
        for _ in range(600):
            try:
                self.db = psycopg.connect(self.args.database_url, autocommit=True)
                self.admin = psycopg.connect(self.args.admin_url, autocommit=True)
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise RuntimeError("the database did not come back")

    # --- consumers ------------------------------------------------------------------------------
    def start_consumer(self, mode, queue, name, crash_after):
        env = dict(os.environ)
        env.update({"AMQP_URL": self.args.amqp_url, "DATABASE_URL": self.args.database_url, "QUEUE": queue,
                    "CONSUMER_MODE": mode, "PREFETCH": str(self.args.prefetch), "CONSUMER_ID": name,
                    "IDEM_LEASE_SECONDS": str(self.args.lease)})
        env["READY_FILE"] = self.ready_file(name)
        env.pop("CRASH_AFTER_COMMIT", None)
        if crash_after:
            env["CRASH_AFTER_COMMIT"] = str(crash_after)
        log = open(os.path.join(self.args.log_dir, "%s-%s.log" % (self.args.lang, mode)), "ab")
        log.write(("# %s: %s CRASH_AFTER_COMMIT=%s\n" % (name, " ".join(self.args.command), crash_after or "")).encode())
        log.flush()
        proc = subprocess.Popen(self.args.command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.figures["consumer_starts"] += 1
        return proc

    def ready_file(self, name):
        """The file a consumer creates once SIGTERM stops it gracefully (READY_FILE)."""
        return os.path.join(self.args.log_dir, "%s.ready" % name)

    @staticmethod
    def stop(proc, sig):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def run_mode(self, mode):
        a = self.args
        prefix = "%s-%s-s%d-" % (a.lang, mode, a.seed)
        queue = "conf.%s.%s" % (a.lang, mode)
        print("# broker-%s, CONSUMER_MODE=%s: queue %s, %d messages, %d consumers, PREFETCH=%d"
              % (a.lang, mode, queue, a.messages, a.consumers, a.prefetch), flush=True)
        dlq = self.declare(queue)
        bodies = {}  # message id -> the amounts published under it
        publications = []
        for i in range(a.messages):
            mid = "%s%05d" % (prefix, i)
            amount = self.rng.randint(1, 1000)
            bodies[mid] = {amount}
            publications += [(mid, amount)] * self.rng.randint(1, 3)
            if i % 20 == 7:  # the same message_id, another body
                publications.append((mid, amount + 1))
                bodies[mid].add(amount + 1)
        self.rng.shuffle(publications)
        self.publish(queue, publications)
        self.figures["messages"] += a.messages
        answers_before = self.claim_answers()

        crash_left = a.crash_kills
        sigkill_at = sorted(self.rng.sample(range(a.messages // 5, a.messages * 4 // 5), a.sigkills)) \
            if mode != "two_phase" else []
        restart_at = a.messages // 2 if (a.pg_restart_cmd and mode == a.pg_restart_mode) else None
        procs, n_started = {}, 0
        graceful_bad, finishing = [], False
        deadline = time.monotonic() + a.deadline
        while True:
            if time.monotonic() > deadline:
                self.check("%s: drained within %d s (it did not: a consumer stuck, or messages lost)"
                           % (mode, a.deadline), False)
                for p in procs.values():
                    self.stop(p, signal.SIGKILL)
                    p.wait()
                break
            # Consumers that exited: a crash (CRASH_AFTER_COMMIT), a kill, or an error exit.
            for name, p in list(procs.items()):
                rc = p.poll()
                if rc is not None:
                    del procs[name]
                    if rc == -signal.SIGKILL:
                        pass
                    elif finishing:
                        if rc != 0:
                            graceful_bad.append((name, rc))
                    else:
                        print("# %s exited with %s (restarted)" % (name, rc), flush=True)
            if not finishing:
                while len(procs) < a.consumers:
                    n_started += 1
                    name = "%s-%s-%d" % (a.lang, mode, n_started)
                    crash = None
                    if crash_left > 0:
                        crash_left -= 1
                        crash = self.rng.randint(1, 4 if mode == "batch" else 25)
                        self.figures["crash_kills"] += 1
                    procs[name] = self.start_consumer(mode, queue, name, crash)
            try:
                eff = self.effects(prefix)
            except psycopg.OperationalError:
                self.reconnect_db()
                continue
            done = len(eff)
            if sigkill_at and done >= sigkill_at[0] and procs:
                sigkill_at.pop(0)
                victim = sorted(procs)[0]
                self.stop(procs[victim], signal.SIGKILL)
                self.figures["sigkills"] += 1
                print("# SIGKILL %s at %d effects" % (victim, done), flush=True)
            if restart_at is not None and done >= restart_at:
                restart_at = None
                print("# restarting PostgreSQL (--pg-restart-cmd) at %d effects" % done, flush=True)
                # The statistics start again with the server: what was counted until now is kept.
                answers_before -= self.claim_answers()
                rc = subprocess.call(a.pg_restart_cmd, shell=True)
                self.check("%s: PostgreSQL restarted (exit %d)" % (mode, rc), rc == 0)
                self.figures["pg_restarts"] += 1
                self.reconnect_db()
                continue
            applied = {mid: v[1] for mid, v in eff.items() if v[0] == 1}
            want_dead = sum(1 for mid, amount in publications if mid in applied and amount != applied[mid])
            if finishing and not procs:
                if self.queue_depth(queue) == 0:
                    break
                finishing = False  # deliveries in hand at the stop went back: consume them
                continue
            if not finishing and done == len(bodies) and self.queue_depth(queue) == 0 \
                    and self.queue_depth(dlq) >= want_dead:
                finishing = True
                # Each consumer is consuming (registered with the broker, so past its start-up)
                # before it is asked to stop: a process killed by SIGTERM before it could install
                # its handler says nothing about its graceful stop.
                # The broker's count alone is not enough: a consumer killed just before may still
                # be counted while the one started in its place has not yet set up its handler.
                # Each live consumer says so itself (READY_FILE).
                for _ in range(600):
                    live = [n for n, p in procs.items() if p.poll() is None]
                    if self.consumers_registered(queue) >= len(live) and \
                            all(os.path.exists(self.ready_file(n)) for n in live):
                        break
                    time.sleep(0.05)
                for p in procs.values():
                    self.stop(p, signal.SIGTERM)
                stop_deadline = time.monotonic() + 30
                for name, p in list(procs.items()):
                    try:
                        p.wait(timeout=max(0.1, stop_deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        graceful_bad.append((name, "no exit 30 s after SIGTERM"))
                        self.stop(p, signal.SIGKILL)
                        p.wait()
                continue
            time.sleep(0.1)

        # --- the counts -----------------------------------------------------------------------
        eff = self.effects(prefix)
        double = {m: v[0] for m, v in eff.items() if v[0] > 1}
        lost = sorted(set(bodies) - set(eff))
        wrong = {m: v for m, v in eff.items() if v[1] not in bodies.get(m, ()) or v[2] not in bodies.get(m, ())}
        dead = self.drain_dead_letters(dlq)
        applied = {mid: v[1] for mid, v in eff.items()}
        want_dead = sorted(seq for seq, (mid, amount) in enumerate(publications) if amount != applied.get(mid, amount))
        got_dead = sorted(x[0] for x in dead)
        deliveries = self.claim_answers() - answers_before
        self.figures["deliveries"] += deliveries
        self.figures["dead_lettered"] += len(dead)
        mismatched_ids = sum(1 for b in bodies.values() if len(b) > 1)
        print("# %s: %d messages, %d publications (%d ids with a mismatch), %d deliveries (claim answers counted by "
              "the statistics; a lower bound across a server crash), "
              "%d consumer starts" % (mode, len(bodies), len(publications), mismatched_ids, deliveries, n_started),
              flush=True)
        self.check("%s: 0 double effects (%d)" % (mode, len(double)), not double, sorted(double.items())[:10])
        self.check("%s: 0 lost messages (%d)" % (mode, len(lost)), not lost, lost[:10])
        self.check("%s: every effect's amount is a body published under its id" % mode, not wrong,
                   sorted(wrong.items())[:10])
        self.check("%s: every publication whose body is not the one applied is in the dead-letter queue, and "
                   "nothing else (%d)" % (mode, len(want_dead)), got_dead == want_dead and len(want_dead) > 0,
                   "want %s\n    got %s" % (want_dead[:20], got_dead[:20]))
        self.check("%s: the queue is empty" % mode, self.queue_depth(queue) == 0, self.queue_depth(queue))
        self.check("%s: every graceful stop (SIGTERM) exited 0" % mode, not graceful_bad, graceful_bad)
        self.check("%s: the deliveries outnumber the messages (duplicates were delivered: %d > %d)"
                   % (mode, deliveries, len(bodies)), deliveries > len(bodies))

    def run(self):
        try:
            for mode in self.args.modes.split(","):
                self.run_mode(mode)
            owners = self.admin.execute("SELECT DISTINCT owner FROM idempotency.idempotency_keys").fetchall()
            self.check("every key belongs to the consumers' role (%s)" % owners,
                       owners == self.db.execute("SELECT current_user").fetchall())
        except Exception as e:
            self.check("the run could not go on: %s: %s" % (type(e).__name__, e), False)
        f = self.figures
        print("# broker-%s figures: %d messages, %d publications, %d deliveries, %d dead-lettered, %d consumer "
              "starts, %d kills (%d CRASH_AFTER_COMMIT, %d SIGKILL), %d PostgreSQL restarts"
              % (self.args.lang, f["messages"], f["publications"], f["deliveries"], f["dead_lettered"],
                 f["consumer_starts"], f["crash_kills"] + f["sigkills"], f["crash_kills"], f["sigkills"],
                 f["pg_restarts"]), flush=True)
        print("broker-%s: %d passed, %d failed" % (self.args.lang, self.passed, self.failed), flush=True)
        return self.failed == 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lang", required=True)
    p.add_argument("--amqp-url", required=True)
    p.add_argument("--database-url", required=True, help="the consumers' role")
    p.add_argument("--admin-url", required=True, help="a superuser, same database: the statistics and key owners")
    p.add_argument("--modes", default="single,batch,two_phase")
    p.add_argument("--messages", type=int, default=300)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--prefetch", type=int, default=20)
    p.add_argument("--lease", type=int, default=5, help="IDEM_LEASE_SECONDS for two_phase claims")
    p.add_argument("--seed", type=int, default=20261205)
    p.add_argument("--crash-kills", type=int, default=3, help="CRASH_AFTER_COMMIT starts per mode")
    p.add_argument("--sigkills", type=int, default=2, help="SIGKILLs from outside per mode (not two_phase)")
    p.add_argument("--pg-restart-cmd", default="")
    p.add_argument("--pg-restart-mode", default="batch")
    p.add_argument("--log-dir", default=".")
    p.add_argument("--deadline", type=int, default=600,
                   help="seconds per mode to drain the queue: a bound that fails a stuck run, not a verdict on speed")
    p.add_argument("command", nargs="+")
    args = p.parse_args()
    print("# broker-%s: seed %d (--seed to repeat)" % (args.lang, args.seed), flush=True)
    return 0 if Run(args).run() else 1


if __name__ == "__main__":
    sys.exit(main())
