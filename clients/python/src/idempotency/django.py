"""Django: add "idempotency.django.IdempotencyMiddleware" to MIDDLEWARE and set

    IDEMPOTENCY = {"DATABASE_URL": "...", "CONFIG": idempotency.Config(...)}

in settings (or IDEMPOTENCY = {"ENGINE": an idempotency.Idempotency}). The view finds the
claim in request.idempotency (a Context; None for methods that need no key): its writes must
go through request.idempotency.connection (a psycopg 3 connection, not the ORM's), which in
inbox mode is inside the claim's transaction. The policy document is served at
Config.policy_url.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

from django.conf import settings
from django.http import HttpRequest, HttpResponse

from .core import Config, HandlerFailed, Request, Response, body_too_large
from .engine import Context, Idempotency

_engine: Optional[Idempotency] = None
_lock = threading.Lock()


def engine() -> Idempotency:
    """The process's engine, made once from settings.IDEMPOTENCY."""
    global _engine
    conf = getattr(settings, "IDEMPOTENCY", {})
    if conf.get("ENGINE") is not None:
        return conf["ENGINE"]  # type: ignore[no-any-return]
    with _lock:
        if _engine is None:
            _engine = Idempotency(conf.get("DATABASE_URL", ""), conf.get("CONFIG") or Config())
        return _engine


class IdempotencyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        eng = engine()
        if request.method == "GET" and request.path == eng.config.policy_path:
            return to_django(eng.policy_response())
        if not eng.applies_to(request.method or ""):
            request.idempotency = None  # type: ignore[attr-defined]
            return self.get_response(request)
        limit = eng.config.max_body_bytes
        if limit is not None and int(request.META.get("CONTENT_LENGTH") or 0) > limit:
            return to_django(body_too_large(eng.config))  # not read at all
        req = Request(request.method or "", request.path, list(request.headers.items()), request.body, native=request)

        def handler(ctx: Context) -> Response:
            request.idempotency = ctx  # type: ignore[attr-defined]
            request._idempotency_raised = False  # type: ignore[attr-defined]
            rv = self.get_response(request)
            if request._idempotency_raised and rv.status_code >= 500:  # type: ignore[attr-defined]
                raise HandlerFailed("the view raised")  # its writes roll back (Http404 & co. are answers)
            headers = list(rv.items())
            headers += [("Set-Cookie", c.output(header="").strip()) for c in rv.cookies.values()]
            content = rv.content if not rv.streaming else b"".join(rv.streaming_content)
            return Response(rv.status_code, headers, content)

        return to_django(eng.handle(req, handler))

    def process_exception(self, request: HttpRequest, exception: Exception) -> None:
        # Django turns the view's exception into a 500 response; remember that it raised.
        request._idempotency_raised = True  # type: ignore[attr-defined]
        return None


def to_django(response: Response) -> HttpResponse:
    rv = HttpResponse(response.body, status=response.status)
    del rv["Content-Type"]
    rv["Content-Length"] = str(len(response.body))
    for k, v in response.headers:
        if k.lower() == "content-length":
            continue
        if k.lower() == "set-cookie":
            rv.cookies.load(v)
        else:
            rv[k] = v  # a repeated header other than Set-Cookie keeps its last value
    return rv
