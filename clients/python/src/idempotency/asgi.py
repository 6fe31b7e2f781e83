"""ASGI middleware (Starlette, FastAPI): app.add_middleware(IdempotencyMiddleware, engine=...).

The handler finds the claim in request.state.idempotency (an AsyncContext; None for methods
that need no key): its writes must go through request.state.idempotency.connection (an
psycopg AsyncConnection), which in inbox mode is inside the claim's transaction.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Dict, List, MutableMapping, Optional

from . import core
from .core import Request, Response
from .engine import AsyncContext, AsyncIdempotency

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class IdempotencyMiddleware:
    """Makes POST and PATCH (Config.required_for) of APP idempotent; serves the policy
    document at Config.policy_url when serve_policy is true."""

    def __init__(self, app: Callable[..., Awaitable[None]], engine: AsyncIdempotency, serve_policy: bool = True) -> None:
        self.app = app
        self.engine = engine
        self.serve_policy = serve_policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"].upper()
        if self.serve_policy and method == "GET" and scope["path"] == self.engine.config.policy_path:
            await _send(send, self.engine.policy_response())
            return
        if not self.engine.applies_to(method):
            scope.setdefault("state", {})["idempotency"] = None
            await self.app(scope, receive, send)
            return
        chunks: List[bytes] = []
        size, limit = 0, self.engine.config.max_body_bytes
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if limit is not None and size > limit:  # stop reading: never buffer more than the limit
                await _send(send, core.body_too_large(self.engine.config))
                return
            chunks.append(chunk)
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", [])]
        request = Request(method, scope["path"], headers, body, native=scope)

        async def handler(ctx: AsyncContext) -> Response:
            scope.setdefault("state", {})["idempotency"] = ctx
            return await _collect(self.app, scope, body)

        await _send(send, await self.engine.handle(request, handler))


async def _collect(app: Callable[..., Awaitable[None]], scope: Scope, body: bytes) -> Response:
    """Runs APP on the buffered BODY and collects its whole response."""
    sent = False
    start: Dict[str, Any] = {}
    parts: List[bytes] = []

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            start.update(message)
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(scope, receive, send)
    if not start:
        raise RuntimeError("the application sent no response")
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start.get("headers", [])]
    return Response(start["status"], headers, b"".join(parts))


async def _send(send: Send, response: Response, extra: Optional[List[Any]] = None) -> None:
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in response.headers if k.lower() != "content-length"]
    headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
