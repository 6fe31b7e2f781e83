"""Flask: idem = FlaskIdempotency(engine, app); @idem.idempotent on a view.

The view finds the claim in flask.g.idempotency (a Context): its writes must go through
g.idempotency.connection, which in inbox mode is inside the claim's transaction.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import flask
from werkzeug.exceptions import HTTPException

from .core import HandlerFailed, Request, Response, body_too_large
from .engine import Context, Idempotency


class FlaskIdempotency:
    """init_app(app) serves the policy document at Config.policy_url."""

    def __init__(self, engine: Idempotency, app: Optional[flask.Flask] = None) -> None:
        self.engine = engine
        if app is not None:
            self.init_app(app)

    def init_app(self, app: flask.Flask) -> None:
        app.add_url_rule(self.engine.config.policy_path, "idempotency_policy", self._policy, methods=["GET"])
        app.extensions["idempotency"] = self

    def _policy(self) -> flask.Response:
        return to_flask(self.engine.policy_response())

    def idempotent(self, view: Callable[..., Any]) -> Callable[..., Any]:
        """Decorates a view: POST and PATCH need a key and run once per key."""

        @functools.wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            req = flask.request
            if not self.engine.applies_to(req.method):
                flask.g.idempotency = None
                return view(*args, **kwargs)
            limit = self.engine.config.max_body_bytes
            if limit is not None and (req.content_length or 0) > limit:
                return to_flask(body_too_large(self.engine.config))  # not read at all
            request = Request(req.method, req.path, list(req.headers.items()), req.get_data(cache=True), native=req)

            def handler(ctx: Context) -> Response:
                flask.g.idempotency = ctx
                try:
                    rv = flask.make_response(view(*args, **kwargs))
                except HTTPException as e:  # abort(4xx): an answer like any other
                    rv = e.get_response()
                return Response(rv.status_code, list(rv.headers.items()), rv.get_data())

            return to_flask(self.engine.handle(request, handler))

        return wrapper


def to_flask(response: Response) -> flask.Response:
    rv = flask.Response(response.body, status=response.status)
    rv.headers.clear()
    for k, v in response.headers:
        rv.headers.add(k, v)
    return rv


__all__ = ["FlaskIdempotency", "HandlerFailed", "to_flask"]
