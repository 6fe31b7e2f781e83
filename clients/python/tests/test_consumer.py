"""The consumer helpers against a real server and a recording channel (no broker): what each
claim answer does to the message, and that the effect happens once."""

import json
import types

import psycopg
import pytest

from idempotency.consumer import Consumer, Delivery, Retry

INSERT = "INSERT INTO broker_effects (message_id, consumer, amount) VALUES (%s::text, 'test', %s::int)"


class Channel:
    """Records how deliveries are settled, as pika's BlockingChannel would be called."""

    def __init__(self):
        self.calls = []

    def basic_ack(self, delivery_tag, multiple=False):
        self.calls.append(("ack", delivery_tag, multiple))

    def basic_nack(self, delivery_tag, multiple=False, requeue=True):
        self.calls.append(("nack", delivery_tag, multiple, requeue))

    def basic_reject(self, delivery_tag, requeue=True):
        self.calls.append(("reject", delivery_tag, requeue))


_tags = iter(range(1, 10**9))


def msg(message_id, amount=5, header_key=None, body=None):
    props = types.SimpleNamespace(message_id=message_id, headers={"Idempotency-Key": header_key} if header_key else None)
    raw = body if body is not None else json.dumps({"account": "a1", "amount": amount}).encode()
    return Delivery(types.SimpleNamespace(delivery_tag=next(_tags)), props, raw)


def effect(ctx):
    ctx.connection.execute(INSERT, (ctx.key, json.loads(ctx.body)["amount"]))
    return {"ok": True}


def effects(sql, key):
    return sql("SELECT count(*) FROM broker_effects WHERE message_id = %s::text", key)[0][0]


@pytest.fixture
def consumer(tables):
    made = []

    def make(handler=effect, **kw):
        c = Consumer(tables, handler, **kw)
        c.slept = []
        c.sleep = c.slept.append  # deterministic: record the waits instead of waiting
        made.append(c)
        return c

    yield make
    for c in made:
        c._drop_db()


def test_single_once_then_replay_ack(consumer, sql, key):
    c, ch = consumer(), Channel()
    a, b = msg(key), msg(key)
    assert c.process_one(ch, a) == "claimed"
    assert c.process_one(ch, b) == "replay"
    assert ch.calls == [("ack", a.tag, False), ("ack", b.tag, False)]
    assert effects(sql, key) == 1


def test_key_header_wins_over_message_id_and_json_order(consumer, sql, key):
    c, ch = consumer(), Channel()
    c.process_one(ch, msg("id-1", header_key=key))
    again = msg("id-2", header_key=key, body=b'{"amount": 5, "account": "a1"}')
    assert c.process_one(ch, again) == "replay"
    assert effects(sql, key) == 1


def test_mismatch_is_dead_lettered(consumer, sql, key):
    c, ch = consumer(), Channel()
    c.process_one(ch, msg(key, 5))
    m = msg(key, 6)
    assert c.process_one(ch, m) == "mismatch"
    assert ch.calls[-1] == ("reject", m.tag, False) and effects(sql, key) == 1


def test_in_progress_is_requeued_after_retry_after(consumer, sql, key, tables):
    holder = psycopg.connect(tables)
    holder.execute("SELECT idempotency.claim_key(%s::text)", (key,))
    try:
        c, ch = consumer(), Channel()
        m = msg(key)
        assert c.process_one(ch, m) == "in_progress"
        assert ch.calls == [("nack", m.tag, False, True)]
        assert c.slept and c.slept[0] >= 0.1  # it waited before the requeue: no hot loop
    finally:
        holder.close()


def test_no_key_is_dead_lettered(consumer):
    c, ch = consumer(), Channel()
    m = msg(None)
    assert c.process_one(ch, m) == "no_key" and ch.calls == [("reject", m.tag, False)]


def test_handler_error_rolls_back_and_dead_letters_retry_requeues(consumer, sql, key):
    def boom(ctx):
        effect(ctx)
        raise ValueError("poison")

    c, ch = consumer(boom), Channel()
    m = msg(key)
    assert c.process_one(ch, m) == "handler_error"
    assert ch.calls == [("reject", m.tag, False)] and effects(sql, key) == 0

    def transient(ctx):
        effect(ctx)
        raise Retry("later")

    c2, ch2 = consumer(transient), Channel()
    m2 = msg(key)
    assert c2.process_one(ch2, m2) == "retry"
    assert ch2.calls == [("nack", m2.tag, False, True)] and c2.slept and effects(sql, key) == 0
    assert consumer().process_one(Channel(), msg(key)) == "claimed"  # claimed afresh: nothing kept
    assert effects(sql, key) == 1


def test_database_error_requeues_with_backoff(sql, key):
    def connect():
        raise psycopg.OperationalError("the server is away")

    c = Consumer("", effect, connect=connect)
    c.slept = []
    c.sleep = c.slept.append
    ch = Channel()
    m1, m2 = msg(key), msg(key)
    assert c.process_one(ch, m1) == "db_error" and c.process_one(ch, m2) == "db_error"
    assert ch.calls == [("nack", m1.tag, False, True), ("nack", m2.tag, False, True)]
    assert c.slept[0] > 0 and c.slept[1] > c.slept[0]  # backs off


def test_on_commit_runs_after_commit_before_ack(consumer, sql, key):
    seen = []
    c, ch = consumer(on_commit=lambda ds: seen.append((effects(sql, key), list(ch.calls)))), Channel()
    c.process_one(ch, msg(key))
    assert seen == [(1, [])]  # committed (visible to another connection), not yet acked


def test_batch_one_commit_one_multiple_ack(consumer, sql, key):
    commits = []
    c, ch = consumer(mode="batch", on_commit=lambda ds: commits.append(len(ds))), Channel()
    k1, k2, k3 = key + "-1", key + "-2", key + "-3"
    consumer().process_one(Channel(), msg(k3))  # done before: a replay in the batch
    batch = [msg(k1, 1), msg(k2, 2), msg(k1, 1), msg(k2, 99), msg(k3), msg(None)]
    out = c.process_batch(ch, batch)
    assert out == ["claimed", "claimed", "repeat", "mismatch", "replay", "no_key"]
    assert effects(sql, k1) == 1 and effects(sql, k2) == 1 and effects(sql, k3) == 1
    assert commits == [5]  # one COMMIT for the five messages with a key
    rejects = sorted(call[1] for call in ch.calls if call[0] == "reject")
    assert rejects == sorted([batch[3].tag, batch[5].tag])
    assert ch.calls[-1] == ("ack", batch[4].tag, True)  # one multiple ack, after the rejects
    assert [call[0] for call in ch.calls].count("ack") == 1
    again = [msg(k1, 1), msg(k2, 2)]
    assert c.process_batch(Channel(), again) == ["replay", "replay"]


def test_batch_failed_message_is_released_others_commit(consumer, sql, key):
    def picky(ctx):
        effect(ctx)
        if json.loads(ctx.body)["amount"] == 13:
            raise ValueError("unlucky")

    c, ch = consumer(picky, mode="batch"), Channel()
    good, bad = msg(key + "-g", 1), msg(key + "-b", 13)
    assert c.process_batch(ch, [good, bad]) == ["claimed", "handler_error"]
    assert effects(sql, key + "-g") == 1 and effects(sql, key + "-b") == 0
    assert ch.calls == [("reject", bad.tag, False), ("ack", good.tag, True)]
    # released, not left claimed: the next claim gets it at once
    assert consumer(mode="batch").process_batch(Channel(), [msg(key + "-b", 13)]) == ["reclaimed"]


def test_batch_in_progress_waits_then_requeues_before_the_ack(consumer, sql, key, tables):
    holder = psycopg.connect(tables)
    holder.execute("SELECT idempotency.claim_key(%s::text)", (key + "-h",))
    try:
        c, ch = consumer(mode="batch"), Channel()
        held, free = msg(key + "-h"), msg(key + "-f")
        assert c.process_batch(ch, [held, free]) == ["in_progress", "claimed"]
        assert ch.calls == [("nack", held.tag, False, True), ("ack", free.tag, True)] and c.slept
    finally:
        holder.close()


def test_batch_database_error_nacks_the_batch(key):
    def connect():
        raise psycopg.OperationalError("away")

    c = Consumer("", effect, mode="batch", connect=connect)
    c.sleep = lambda s: None
    ch = Channel()
    batch = [msg(key + "-1"), msg(key + "-2")]
    assert c.process_batch(ch, batch) == ["db_error", "db_error"]
    assert ch.calls == [("nack", batch[1].tag, True, True)]


def test_two_phase_release_checkpoint_complete(consumer, sql, key, tables):
    seen = []

    def step(ctx):
        seen.append((ctx.status, ctx.recovery_point))
        # the claim has committed: another consumer sees the message in flight
        assert consumer().process_one(Channel(), msg(key)) == "in_progress"
        ctx.connection.execute(INSERT, (ctx.key, 1))  # autocommit: an outside effect
        if len(seen) == 1:
            ctx.checkpoint("charged")
            raise Retry("gateway timeout")
        return {"done": True}

    c = consumer(step, mode="two_phase", lease_seconds=60)
    ch = Channel()
    m1, m2, m3 = msg(key), msg(key), msg(key)
    assert c.process_one(ch, m1) == "retry"
    assert c.process_one(ch, m2) == "reclaimed"
    assert c.process_one(ch, m3) == "replay"
    assert seen == [("claimed", None), ("reclaimed", "charged")]
    assert ch.calls == [("nack", m1.tag, False, True), ("ack", m2.tag, False), ("ack", m3.tag, False)]
    assert effects(sql, key) == 2  # the first attempt's outside effect stays: checkpoints tell


def test_bad_body_for_jsonb_is_dead_lettered(consumer, key):
    c, ch = consumer(), Channel()
    m = msg(key, body=b'{"a": "\\u0000"}')  # JSON that jsonb refuses
    assert c.process_one(ch, m) == "bad_message" and ch.calls == [("reject", m.tag, False)]
    binary = msg(key + "-bin", body=b"\xff\x00 not json")
    assert consumer(lambda ctx: None).process_one(Channel(), binary) == "claimed"
