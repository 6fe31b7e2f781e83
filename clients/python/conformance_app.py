#!/usr/bin/env python3
"""The conformance payments app (clients/conformance/CONTRACT.md) with this package.

Usage: conformance_app.py flask|fastapi|django
Environment: DATABASE_URL, LISTEN (127.0.0.1:PORT), IDEM_MODE, IDEM_STORE_ERRORS, IDEM_WAIT_MS,
IDEM_LEASE_SECONDS, IDEM_TTL_SECONDS. FastAPI is served by uvicorn; Flask and Django by
werkzeug's threaded WSGI server.

In two_phase mode the payment row is written through the context's connection, which then
holds no transaction (autocommit): the outside effect commits at once, apart from the claim.
"""

import json
import os
import sys
import time
import uuid
from typing import Any, Dict, Optional, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "src"))

import idempotency  # noqa: E402

CONFIG = idempotency.Config.from_env(scope=lambda request: request.header("X-Tenant") or "default")
DATABASE_URL = os.environ.get("DATABASE_URL", "")
HOST, _, PORT = os.environ.get("LISTEN", "127.0.0.1:8000").rpartition(":")


def insert_sql(conn_tenant: str, amount: int, note: str) -> Tuple[str, Tuple[Any, ...]]:
    return ("INSERT INTO payments (tenant, amount, note) VALUES (%s::text, %s::int, %s::text) RETURNING id",
            (conn_tenant, amount, note))


def failure(headers_get: Any) -> Optional[Tuple[int, Dict[str, str]]]:
    """X-Sleep-Ms first; then X-Fail: raise (raises), 503 or 400 (answers)."""
    sleep_ms = headers_get("X-Sleep-Ms")
    if sleep_ms:
        time.sleep(int(sleep_ms) / 1000)
    fail = headers_get("X-Fail")
    if fail == "raise":
        raise RuntimeError("X-Fail: raise")
    if fail == "503":
        return 503, {"error": "unavailable"}
    if fail == "400":
        return 400, {"error": "bad amount"}
    return None


def payment(body: bytes) -> Tuple[int, str]:
    doc = json.loads(body or b"{}")
    return int(doc.get("amount", 0)), str(doc.get("note", ""))


def nonce() -> str:
    return str(uuid.uuid4())


# --- Flask -----------------------------------------------------------------------------------


def flask_app() -> Any:
    import flask

    from idempotency.flask import FlaskIdempotency

    app = flask.Flask("conformance")
    idem = FlaskIdempotency(idempotency.Idempotency(DATABASE_URL, CONFIG), app)

    @app.get("/healthz")
    def healthz() -> Any:
        return "ok"

    @app.post("/payments")
    @idem.idempotent
    def payments() -> Any:
        req = flask.request
        tenant = req.headers.get("X-Tenant", "default")
        failed = failure(req.headers.get)
        if failed:
            return flask.jsonify(failed[1]), failed[0]
        amount, note = payment(req.get_data())
        (pid,) = flask.g.idempotency.connection.execute(*insert_sql(tenant, amount, note)).fetchone()
        body = json.dumps({"id": pid, "tenant": tenant, "amount": amount})
        return flask.Response(body, 201, {"Content-Type": "application/json", "Location": f"/payments/{pid}", "X-Request-Nonce": nonce()})

    @app.post("/echo")
    @idem.idempotent
    def echo() -> Any:
        req = flask.request
        data = req.get_data()
        flask.g.idempotency.connection.execute(*insert_sql(req.headers.get("X-Tenant", "default"), len(data), "echo"))
        ctype = req.headers.get("Content-Type", "application/octet-stream")
        return flask.Response(data, 200, {"Content-Type": ctype, "X-Request-Nonce": nonce()})

    return app


# --- FastAPI (ASGI) --------------------------------------------------------------------------


def fastapi_app() -> Any:
    import asyncio

    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse
    from fastapi.responses import Response as FResponse

    from idempotency.asgi import IdempotencyMiddleware

    app = FastAPI()
    app.add_middleware(IdempotencyMiddleware, engine=idempotency.AsyncIdempotency(DATABASE_URL, CONFIG))

    @app.get("/healthz")
    async def healthz() -> Any:
        return PlainTextResponse("ok")

    async def before(request: Request) -> Optional[Tuple[int, Dict[str, str]]]:
        sleep_ms = request.headers.get("X-Sleep-Ms")
        if sleep_ms:
            await asyncio.sleep(int(sleep_ms) / 1000)
        return failure(lambda name: None if name == "X-Sleep-Ms" else request.headers.get(name))

    @app.post("/payments")
    async def payments(request: Request) -> Any:
        tenant = request.headers.get("X-Tenant", "default")
        failed = await before(request)
        if failed:
            return JSONResponse(failed[1], failed[0])
        amount, note = payment(await request.body())
        cur = await request.state.idempotency.connection.execute(*insert_sql(tenant, amount, note))
        (pid,) = await cur.fetchone()
        body = json.dumps({"id": pid, "tenant": tenant, "amount": amount})
        return FResponse(body, 201, {"Location": f"/payments/{pid}", "X-Request-Nonce": nonce()}, media_type="application/json")

    @app.post("/echo")
    async def echo(request: Request) -> Any:
        data = await request.body()
        await request.state.idempotency.connection.execute(*insert_sql(request.headers.get("X-Tenant", "default"), len(data), "echo"))
        ctype = request.headers.get("Content-Type", "application/octet-stream")
        return FResponse(data, 200, {"Content-Type": ctype, "X-Request-Nonce": nonce()})

    return app


# --- Django ----------------------------------------------------------------------------------


def django_app() -> Any:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        SECRET_KEY="conformance-only",
        MIDDLEWARE=["idempotency.django.IdempotencyMiddleware"],
        IDEMPOTENCY={"DATABASE_URL": DATABASE_URL, "CONFIG": CONFIG},
        DATABASES={},
        LOGGING_CONFIG=None,
    )
    django.setup()
    from django.core.wsgi import get_wsgi_application

    return get_wsgi_application()


def _django_views() -> Any:
    from django.http import HttpResponse, JsonResponse
    from django.urls import path
    from django.views.decorators.csrf import csrf_exempt

    def healthz(request: Any) -> Any:
        return HttpResponse("ok", content_type="text/plain")

    @csrf_exempt
    def payments(request: Any) -> Any:
        if request.method != "POST":
            return HttpResponse(status=405)
        tenant = request.headers.get("X-Tenant", "default")
        failed = failure(request.headers.get)
        if failed:
            return JsonResponse(failed[1], status=failed[0])
        amount, note = payment(request.body)
        (pid,) = request.idempotency.connection.execute(*insert_sql(tenant, amount, note)).fetchone()
        rv = HttpResponse(json.dumps({"id": pid, "tenant": tenant, "amount": amount}), status=201, content_type="application/json")
        rv["Location"] = f"/payments/{pid}"
        rv["X-Request-Nonce"] = nonce()
        return rv

    @csrf_exempt
    def echo(request: Any) -> Any:
        if request.method != "POST":
            return HttpResponse(status=405)
        data = request.body
        request.idempotency.connection.execute(*insert_sql(request.headers.get("X-Tenant", "default"), len(data), "echo"))
        rv = HttpResponse(data, status=200, content_type=request.headers.get("Content-Type", "application/octet-stream"))
        rv["X-Request-Nonce"] = nonce()
        return rv

    return [path("healthz", healthz), path("payments", payments), path("echo", echo)]


def __getattr__(name: str) -> Any:  # Django reads urlpatterns from ROOT_URLCONF (this module)
    if name == "urlpatterns":
        return _django_views()
    raise AttributeError(name)


def serve_wsgi(app: Any) -> None:
    from werkzeug.serving import ThreadedWSGIServer, make_server

    ThreadedWSGIServer.request_queue_size = 128  # 50 concurrent clients connect at once
    make_server(HOST, int(PORT), app, threaded=True).serve_forever()


def main() -> None:
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    framework = sys.argv[1] if len(sys.argv) > 1 else ""
    if framework == "flask":
        serve_wsgi(flask_app())
    elif framework == "django":
        serve_wsgi(django_app())
    elif framework == "fastapi":
        import uvicorn

        uvicorn.run(fastapi_app(), host=HOST, port=int(PORT), log_level="warning")
    else:
        sys.exit("usage: conformance_app.py flask|fastapi|django")


if __name__ == "__main__":
    main()
