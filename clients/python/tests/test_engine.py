"""The engines against a real server: the flow of SPEC section 8, statement by statement."""

import asyncio
import json
import threading

import psycopg
import pytest

import idempotency
from idempotency import Config, Request, Response


def post(key, body=b'{"amount": 5}', ctype="application/json", path="/payments", tenant=None):
    headers = [("Content-Type", ctype)]
    if key is not None:
        headers.append(("Idempotency-Key", key))
    if tenant:
        headers.append(("X-Tenant", tenant))
    return Request("POST", path, headers, body)


def pay(note):
    """A handler that writes a payment through the context and answers 201."""

    def handler(ctx):
        (pid,) = ctx.connection.execute(
            "INSERT INTO payments (tenant, amount, note) VALUES ('t', 5, %s::text) RETURNING id", (note,)).fetchone()
        return Response(201, [("Content-Type", "application/json"), ("X-Id", str(pid))], json.dumps({"id": pid}).encode())

    return handler


def count(sql, note):
    return sql("SELECT count(*) FROM payments WHERE note = %s::text", note)[0][0]


@pytest.fixture
def engine(tables):
    engines = []

    def make(**kw):
        e = idempotency.Idempotency(tables, Config(**kw))
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.pool.close()


def test_claim_runs_once_then_replays_byte_for_byte(engine, sql, key):
    e = engine()
    first = e.handle(post(key), pay(key))
    again = e.handle(post(key, b'{ "amount" : 5 }'), pay(key))  # spacing differs: jsonb
    assert first.status == 201 and again.status == 201
    assert again.body == first.body
    # jsonb keeps header names in its own order; repeats of one name keep theirs
    assert sorted(again.headers) == sorted(first.headers + [("Idempotent-Replayed", "true")])
    assert count(sql, key) == 1


def test_json_key_order_replays_and_another_body_is_422(engine, sql, key):
    e = engine()
    e.handle(post(key, b'{"amount": 5, "note": "a"}'), pay(key))
    assert e.handle(post(key, b'{"note": "a", "amount": 5}'), pay(key)).header("Idempotent-Replayed") == "true"
    other = e.handle(post(key, b'{"amount": 6, "note": "a"}'), pay(key))
    assert other.status == 422 and b'"id"' not in other.body
    assert e.handle(post(key, b'{"amount": 5, "note": "a"}', path="/other"), pay(key)).status == 422
    assert count(sql, key) == 1


def test_binary_body_is_fingerprinted_as_bytes(engine, sql, key):
    e = engine()
    data = bytes(range(256))
    r = e.handle(post(key, data, "application/octet-stream"), lambda ctx: Response(200, [("Content-Type", "application/x-b")], data[::-1]))
    rr = e.handle(post(key, data, "application/octet-stream"), pay(key))
    assert rr.body == r.body == data[::-1] and rr.header("Content-Type") == "application/x-b"
    assert e.handle(post(key, data + b"!", "application/octet-stream"), pay(key)).status == 422


def test_missing_and_bad_keys_are_400_without_touching_the_database(tables):
    e = idempotency.Idempotency("host=/nonexistent port=1", Config())  # no server behind it
    for k in (None, "", "a b", "x" * 256):
        r = e.handle(post(k), pay("never"))
        assert r.status == 400 and r.header("Content-Type") == "application/problem+json"


def test_in_flight_is_409_with_retry_after(engine, sql, key, tables):
    holder = psycopg.connect(tables)
    holder.execute("SELECT idempotency.claim_key(%s::text)", (key,))  # open transaction holds it
    try:
        r = engine().handle(post(key), pay(key))
        assert r.status == 409 and int(r.header("Retry-After")) >= 1
    finally:
        holder.rollback()
        holder.close()
    assert engine().handle(post(key), pay(key)).status == 201


def test_wait_replays_when_the_holder_completes(engine, sql, key, tables):
    """The holder commits while the request waits in claim_key (seen in pg_stat_activity)."""
    holder = psycopg.connect(tables)
    e = engine(wait_ms=30000)
    fp = holder.execute(
        "SELECT idempotency.request_fingerprint(jsonb_build_array('POST'::text, '/payments'::text, %s::jsonb))",
        ('{"amount": 5}',)).fetchone()[0]
    (token,) = holder.execute("SELECT token FROM idempotency.claim_key(%s::text, %s::bytea)", (key, fp)).fetchone()
    out = []
    t = threading.Thread(target=lambda: out.append(e.handle(post(key), pay(key))))
    t.start()
    for _ in range(6000):  # a barrier, not a sleep: until the claim is inside the server
        if sql("SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s::text AND state = 'active' AND pid <> pg_backend_pid()",
               "%claim_key(%wait =>%")[0][0]:
            break
        threading.Event().wait(0.005)
    holder.execute("SELECT idempotency.complete_key(%s::text, %s::uuid, NULL::jsonb, 202::int, response_body => 'held'::bytea)", (key, token))
    holder.commit()
    holder.close()
    t.join()
    assert out[0].status == 202 and out[0].body == b"held" and out[0].header("Idempotent-Replayed") == "true"
    assert count(sql, key) == 0


def test_handler_exception_rolls_back_claim_and_writes(engine, sql, key):
    e = engine()

    def boom(ctx):
        pay(key)(ctx)
        raise RuntimeError("after the write")

    r = e.handle(post(key), boom)
    assert r.status == 500 and r.header("Content-Type") == "application/problem+json"
    assert count(sql, key) == 0
    seen = []
    assert e.handle(post(key), lambda ctx: seen.append(ctx.status) or pay(key)(ctx)).status == 201
    assert seen == ["claimed"] and count(sql, key) == 1


def test_5xx_not_stored_by_default(engine, sql, key):
    e = engine()

    def unavailable(ctx):
        pay(key)(ctx)
        return Response(503, [], b"later")

    assert e.handle(post(key), unavailable).status == 503
    assert count(sql, key) == 0  # the 503's writes rolled back with the claim
    assert e.handle(post(key), pay(key)).status == 201


def test_store_errors_stores_5xx_and_exceptions(engine, sql, key):
    e = engine(store_errors=True)

    def boom(ctx):
        pay(key)(ctx)
        raise RuntimeError("x")

    first = e.handle(post(key), boom)
    again = e.handle(post(key), pay(key))
    assert first.status == 500 and again.status == 500 and again.header("Idempotent-Replayed") == "true"
    assert count(sql, key) == 0  # the exception's writes rolled back (a savepoint), the 500 stayed
    k2 = key + "-503"
    assert e.handle(post(k2), lambda ctx: Response(503, [], b"x")).status == 503
    assert e.handle(post(k2), pay(k2)).body == b"x"


def test_4xx_is_stored(engine, sql, key):
    e = engine()
    assert e.handle(post(key), lambda ctx: Response(400, [("Content-Type", "text/plain")], b"bad amount")).status == 400
    r = e.handle(post(key), pay(key))
    assert (r.status, r.body, r.header("Idempotent-Replayed")) == (400, b"bad amount", "true")


def test_scope_hook_separates_tenants(engine, sql, key):
    e = engine(scope=lambda req: req.header("X-Tenant") or "")
    a = e.handle(post(key, tenant="a"), pay(key))
    b = e.handle(post(key, tenant="b"), pay(key))
    assert a.body != b.body and count(sql, key) == 2
    assert e.handle(post(key, tenant="a"), pay(key)).body == a.body


def test_sqlstates_from_the_database(engine, sql, key, tables):
    r = engine(scope=lambda req: "s" * 256).handle(post(key), pay(key))  # 22001
    assert r.status == 400
    big = engine().handle(post(key), lambda ctx: pay(key)(ctx) and Response(200, [], b"x" * (1 << 20 + 1)))  # 54000
    assert big.status == 413 and count(sql, key) == 0
    down = idempotency.Idempotency("host=127.0.0.1 port=1 connect_timeout=2", Config())
    r = down.handle(post(key), pay(key))
    assert r.status == 503 and r.header("Retry-After")


def test_no_usage_on_the_schema_is_500(admin_dsn, tables, key):
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS idem_no_usage")
        admin.execute("CREATE ROLE idem_no_usage LOGIN")
    try:
        e = idempotency.Idempotency(psycopg.conninfo.make_conninfo(tables, user="idem_no_usage"), Config())
        r = e.handle(post(key), pay(key))
        assert r.status == 500
        e.pool.close()
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute("DROP ROLE idem_no_usage")


def test_serialization_failures_are_retried_then_503(engine, sql, key):
    e = engine()
    calls = []

    def flaky(ctx):
        calls.append(ctx.token)
        if len(calls) < 3:
            pay(key)(ctx)
            raise psycopg.errors.SerializationFailure("could not serialize")
        return pay(key)(ctx)

    assert e.handle(post(key), flaky).status == 201
    assert len(calls) == 3 and count(sql, key) == 1
    always = []
    r = e.handle(post(key + "x"), lambda ctx: always.append(1) or (_ for _ in ()).throw(psycopg.errors.DeadlockDetected("d")))
    assert r.status == 503 and r.header("Retry-After") and len(always) == 4  # 1 + 3 retries


def test_two_phase_commits_the_claim_first_and_releases_on_failure(engine, sql, key, tables):
    e = engine(mode="two_phase", lease_seconds=60)
    seen = []

    def step(ctx):
        seen.append((ctx.status, ctx.attempts, ctx.recovery_point))
        # the claim is committed: another connection sees the key in flight
        other = idempotency.Idempotency(tables, Config()).handle(post(key), pay("other"))
        assert other.status == 409 and 30 <= int(other.header("Retry-After")) <= 60
        ctx.connection.execute("INSERT INTO payments (tenant, amount, note) VALUES ('t', 1, %s::text)", (key,))
        if len(seen) == 1:
            ctx.checkpoint("charged")
            return Response(503, [], b"gateway down")
        return Response(201, [], b"done")

    assert e.handle(post(key), step).status == 503
    r = e.handle(post(key), step)
    assert r.status == 201 and seen == [("claimed", 1, None), ("reclaimed", 2, "charged")]
    assert count(sql, key) == 2  # outside effects are not rolled back: that is what checkpoints are for
    assert e.handle(post(key), step).body == b"done" and len(seen) == 2


def test_two_phase_exception_releases(engine, sql, key):
    e = engine(mode="two_phase")
    assert e.handle(post(key), lambda ctx: 1 / 0).status == 500
    seen = []
    assert e.handle(post(key), lambda ctx: seen.append(ctx.status) or Response(201, [], b"")).status == 201
    assert seen == ["reclaimed"]


def test_inbox_has_no_checkpoints(engine, key):
    def handler(ctx):
        ctx.checkpoint("x")

    assert engine().handle(post(key), handler).status == 500


# --- the asynchronous engine: the same flow ------------------------------------------------


def run_async(dsn, requests, **kw):
    async def main():
        e = idempotency.AsyncIdempotency(dsn, Config(**kw))
        out = []
        for req, handler in requests:
            out.append(await e.handle(req, handler))
        await e.pool.close()
        return out

    return asyncio.run(main())


def apay(note, status=201):
    async def handler(ctx):
        cur = await ctx.connection.execute(
            "INSERT INTO payments (tenant, amount, note) VALUES ('t', 5, %s::text) RETURNING id", (note,))
        (pid,) = await cur.fetchone()
        if status == "raise":
            raise RuntimeError("x")
        return Response(status, [("X-Id", str(pid))], str(pid).encode())

    return handler


def test_async_inbox(tables, sql, key):
    a, b, c, d = run_async(tables, [(post(key), apay(key, "raise")), (post(key), apay(key, 503)),
                                    (post(key), apay(key)), (post(key), apay(key))])
    assert (a.status, b.status, c.status, d.status) == (500, 503, 201, 201)
    assert d.body == c.body and d.header("Idempotent-Replayed") == "true" and count(sql, key) == 1
    (m,) = run_async(tables, [(post(key, b'{"amount": 6}'), apay(key))])
    assert m.status == 422


def test_async_two_phase_and_checkpoint(tables, sql, key):
    seen = []

    async def step(ctx):
        seen.append((ctx.status, ctx.recovery_point))
        if len(seen) == 1:
            await ctx.checkpoint("half")
            raise RuntimeError("transient")
        return Response(201, [], b"ok")

    a, b, c = run_async(tables, [(post(key), step)] * 3, mode="two_phase")
    assert (a.status, b.status, c.status) == (500, 201, 201) and c.header("Idempotent-Replayed") == "true"
    assert seen == [("claimed", None), ("reclaimed", "half")]


def test_async_store_errors_and_in_flight(tables, sql, key):
    a, b = run_async(tables, [(post(key), apay(key, "raise")), (post(key), apay(key))], store_errors=True)
    assert (a.status, b.status) == (500, 500) and count(sql, key) == 0
    holder = psycopg.connect(tables)
    holder.execute("SELECT idempotency.claim_key(%s::text)", (key + "h",))
    try:
        (r,) = run_async(tables, [(post(key + "h"), apay(key))])
        assert r.status == 409 and r.header("Retry-After")
    finally:
        holder.close()


def test_body_limit(engine, sql, key):
    e = engine(max_body_bytes=10)
    assert e.handle(post(key, b'{"amount": 55555}'), pay(key)).status == 413
    assert e.handle(post(key, b'{"a": 5}'), pay(key)).status == 201
