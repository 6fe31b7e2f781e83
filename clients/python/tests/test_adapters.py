"""The three adapters in process: each hands the handler the claim's connection, replays byte
for byte, answers 400 / 409 / 422 as problems, rolls a raising view back, serves the policy."""

import json

import psycopg
import pytest

import idempotency
from idempotency import Config

JSON = {"Content-Type": "application/json"}


def insert(conn, note):
    return conn.execute("INSERT INTO payments (tenant, amount, note) VALUES ('t', 1, %s::text) RETURNING id", (note,)).fetchone()[0]


# --- one client per framework: post(path, body, headers) -> (status, headers dict lowercased, body)


def flask_client(dsn, config):
    import flask

    from idempotency.flask import FlaskIdempotency

    app = flask.Flask("t")
    idem = FlaskIdempotency(idempotency.Idempotency(dsn, config), app)

    @app.route("/payments", methods=["GET", "POST"])
    @idem.idempotent
    def payments():
        if flask.request.method == "GET":
            return {"ctx": flask.g.idempotency is None}
        note = flask.request.get_json()["note"]
        if flask.request.headers.get("X-Abort"):
            flask.abort(404)
        pid = insert(flask.g.idempotency.connection, note)
        if flask.request.headers.get("X-Fail"):
            raise RuntimeError("after the write")
        return flask.Response(json.dumps({"id": pid}), 201, {"Content-Type": "application/json", "Set-Cookie": "a=1"})

    client = app.test_client()

    def post(path, body, headers, method="POST"):
        r = client.open(path, method=method, data=body, headers=headers)
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.get_data()

    return post, lambda: None


def fastapi_client(dsn, config):
    from fastapi import FastAPI, Request
    from fastapi.responses import Response
    from fastapi.testclient import TestClient

    from idempotency.asgi import IdempotencyMiddleware

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, engine=idempotency.AsyncIdempotency(dsn, config))

    @app.get("/payments")
    async def get_payments(request: Request):
        return {"ctx": request.state.idempotency is None}

    @app.post("/payments")
    async def payments(request: Request):
        note = (await request.json())["note"]
        if request.headers.get("X-Abort"):
            return Response(b"", 404)
        cur = await request.state.idempotency.connection.execute(
            "INSERT INTO payments (tenant, amount, note) VALUES ('t', 1, %s::text) RETURNING id", (note,))
        (pid,) = await cur.fetchone()
        if request.headers.get("X-Fail"):
            raise RuntimeError("after the write")
        return Response(json.dumps({"id": pid}), 201, {"Set-Cookie": "a=1"}, media_type="application/json")

    client = TestClient(app, raise_server_exceptions=False)
    client.__enter__()

    def post(path, body, headers, method="POST"):
        r = client.request(method, path, content=body, headers=headers)
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content

    return post, lambda: client.__exit__(None, None, None)


def django_client(dsn, config):
    from django.conf import settings
    from django.test import Client

    from idempotency.django import engine

    settings.IDEMPOTENCY = {"ENGINE": idempotency.Idempotency(dsn, config)}
    assert engine() is settings.IDEMPOTENCY["ENGINE"]
    client = Client(raise_request_exception=False)

    def post(path, body, headers, method="POST"):
        extra = {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items() if k != "Content-Type"}
        r = client.generic(method, path, body, content_type=headers.get("Content-Type", "application/octet-stream"), **extra)
        out = {k.lower(): v for k, v in r.items()}
        if r.cookies:
            out["set-cookie"] = "; ".join(c.OutputString() for c in r.cookies.values())
        return r.status_code, out, r.content

    return post, lambda: None


def _django_setup():
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF="django_urls", SECRET_KEY="t", DATABASES={},
                           MIDDLEWARE=["idempotency.django.IdempotencyMiddleware"], IDEMPOTENCY={})
        django.setup()


CLIENTS = {"flask": flask_client, "fastapi": fastapi_client, "django": django_client}


@pytest.fixture(params=sorted(CLIENTS))
def make_client(request, tables):
    if request.param == "django":
        _django_setup()
    closers = []

    def make(**kw):
        post, close = CLIENTS[request.param](tables, Config(**kw))
        closers.append(close)
        return post

    yield make
    for c in closers:
        c()


def body(note, **kw):
    return json.dumps(dict(note=note, **kw)).encode()


def count(sql, note):
    return sql("SELECT count(*) FROM payments WHERE note = %s::text", note)[0][0]


def test_replay_byte_for_byte(make_client, sql, key):
    post = make_client()
    s1, h1, b1 = post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key}))
    s2, h2, b2 = post("/payments", body(key), dict(JSON, **{"Idempotency-Key": f'"{key}"'}))
    assert (s1, s2) == (201, 201) and b1 == b2 and count(sql, key) == 1
    assert h2["idempotent-replayed"] == "true" and "idempotent-replayed" not in h1
    assert h1["content-type"] == h2["content-type"] == "application/json"
    assert "a=1" in h1["set-cookie"] and "a=1" in h2["set-cookie"]


def test_problems(make_client, sql, key):
    post = make_client(policy_url="https://example.test/keys")
    s, h, b = post("/payments", body(key), JSON)
    assert s == 400 and h["content-type"] == "application/problem+json"
    assert json.loads(b)["type"] == "https://example.test/keys"
    assert post("/payments", body(key), dict(JSON, **{"Idempotency-Key": "x" * 256}))[0] == 400
    post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key}))
    s, h, b = post("/payments", body(key, amount=2), dict(JSON, **{"Idempotency-Key": key}))
    assert s == 422 and b'"id"' not in b and h["content-type"] == "application/problem+json"


def test_in_flight(make_client, tables, key):
    post = make_client()
    holder = psycopg.connect(tables)
    holder.execute("SELECT idempotency.claim_key(%s::text)", (key,))
    try:
        s, h, b = post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key}))
        assert s == 409 and int(h["retry-after"]) >= 1 and h["content-type"] == "application/problem+json"
    finally:
        holder.close()


def test_raising_view_rolls_back(make_client, sql, key):
    post = make_client()
    s, _, _ = post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key, "X-Fail": "1"}))
    assert s == 500 and count(sql, key) == 0
    s, _, _ = post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key}))
    assert s == 201 and count(sql, key) == 1


def test_raising_view_stored_with_store_errors(make_client, sql, key):
    post = make_client(store_errors=True)
    assert post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key, "X-Fail": "1"}))[0] == 500
    s, h, _ = post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key}))
    assert s == 500 and h["idempotent-replayed"] == "true" and count(sql, key) == 0


def test_a_4xx_of_the_view_is_stored(make_client, sql, key):
    post = make_client()
    assert post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key, "X-Abort": "1"}))[0] == 404
    s, h, _ = post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key}))
    assert s == 404 and h["idempotent-replayed"] == "true" and count(sql, key) == 0


def test_other_methods_pass_through_and_policy(make_client, key):
    post = make_client(ttl_seconds=3600)
    s, _, b = post("/payments", b"", {}, method="GET")
    assert s == 200 and json.loads(b) == {"ctx": True}
    s, h, b = post("/idempotency-policy", b"", {}, method="GET")
    assert s == 200 and h["content-type"] == "application/json"
    assert json.loads(b) == {"header": "Idempotency-Key", "required_for": ["POST", "PATCH"], "max_length": 255, "ttl_seconds": 3600}


def test_two_phase_write_commits_before_the_answer(make_client, sql, key):
    post = make_client(mode="two_phase")
    s, _, _ = post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key, "X-Fail": "1"}))
    assert s == 500 and count(sql, key) == 1  # an outside effect: autocommit, not rolled back
    assert post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key}))[0] == 201  # released: runs again


def test_body_over_the_limit_is_413_and_never_runs(make_client, sql, key):
    post = make_client(max_body_bytes=64)
    s, h, _ = post("/payments", body(key, pad="x" * 100), dict(JSON, **{"Idempotency-Key": key}))
    assert s == 413 and h["content-type"] == "application/problem+json" and count(sql, key) == 0
    assert post("/payments", body(key), dict(JSON, **{"Idempotency-Key": key}))[0] == 201
