"""The request flow, once synchronous (WSGI: Flask, Django) and once asynchronous (ASGI).

inbox:      BEGIN; claim; handler (in a savepoint); complete_key; COMMIT
two_phase:  BEGIN; claim (with a lease); COMMIT; handler; BEGIN; complete_key; COMMIT
            (release_key on a failure, checkpoint_key from the handler)
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Awaitable, Callable, Optional

import psycopg

from . import core
from .core import RETRY, UNAVAILABLE, Claim, Config, Request, Response
from .keys import InvalidKey, parse_key


@dataclasses.dataclass
class Context:
    """What a protected handler gets (request.state.idempotency, flask.g.idempotency,
    request.idempotency).

    connection  the connection the handler's writes must use. inbox: it is inside the
                claim's transaction, so the writes commit with the stored answer or roll
                back with the claim. two_phase: no transaction is open (autocommit): the
                claim has committed, every statement commits at once.
    key, scope, token, attempts, recovery_point: the claim (recovery_point: the last
                checkpoint of an earlier attempt, for a reclaimed key).
    """

    connection: Any
    key: str
    scope: str
    token: uuid.UUID
    status: str
    attempts: Optional[int]
    recovery_point: Optional[str]
    mode: str

    def checkpoint(self, recovery_point: str) -> None:
        """two_phase: records progress and renews the lease (in its own transaction)."""
        if self.mode != "two_phase":
            raise RuntimeError("checkpoints are for two-phase handlers (inbox handlers roll back as a whole)")
        with self.connection.transaction():
            self.connection.execute(core.CHECKPOINT_SQL, {"key": self.key, "token": self.token, "point": recovery_point, "scope": self.scope})
        self.recovery_point = recovery_point


@dataclasses.dataclass
class AsyncContext(Context):
    """Context with an AsyncConnection."""

    async def checkpoint(self, recovery_point: str) -> None:  # type: ignore[override]
        if self.mode != "two_phase":
            raise RuntimeError("checkpoints are for two-phase handlers (inbox handlers roll back as a whole)")
        async with self.connection.transaction():
            await self.connection.execute(core.CHECKPOINT_SQL, {"key": self.key, "token": self.token, "point": recovery_point, "scope": self.scope})
        self.recovery_point = recovery_point


class _Outcome(Exception):
    """Carries the answer out of a transaction that must roll back."""

    def __init__(self, response: Response) -> None:
        super().__init__()
        self.response = response


def _db_trouble(exc: BaseException) -> bool:
    return core.classify(exc) in (RETRY, UNAVAILABLE)


class Idempotency:
    """The synchronous engine (WSGI). Idempotency(DATABASE_URL, Config(...)).

    handle(request, handler) answers REQUEST: handler(context) -> Response runs for a
    claimed key only. Adapters: idempotency.flask, idempotency.django.
    """

    def __init__(self, conninfo: str = "", config: Optional[Config] = None, *, pool: Optional[core.Pool] = None) -> None:
        self.config = config or Config()
        self.pool = pool or core.Pool(conninfo, self.config.pool_size, self.config.pool_timeout)

    def policy_response(self) -> Response:
        return core.policy_response(self.config)

    def applies_to(self, method: str) -> bool:
        return method.upper() in self.config.required_for

    def handle(self, request: Request, handler: Callable[[Context], Response]) -> Response:
        cfg = self.config
        try:
            key = parse_key(request.header(cfg.header), cfg.max_key_length)
        except InvalidKey as e:
            return core.problem(cfg, 400, e.title, e.detail)
        if cfg.max_body_bytes is not None and len(request.body) > cfg.max_body_bytes:
            return core.body_too_large(cfg)
        scope = cfg.scope(request)
        try:
            with self.pool.connection() as conn:
                if cfg.mode == "inbox":
                    return self._retrying(lambda: self._inbox(conn, request, key, scope, handler))
                return self._two_phase(conn, request, key, scope, handler)
        except psycopg.Error as e:
            return core.error_response(cfg, e)

    def _retrying(self, fn: Callable[[], Any]) -> Any:
        for attempt in range(self.config.retries + 1):
            try:
                return fn()
            except psycopg.Error as e:
                if core.classify(e) != RETRY or attempt == self.config.retries:
                    raise

    def _claim(self, conn: psycopg.Connection, request: Request, key: str, scope: str) -> Claim:
        sql, params = core.claim_params(self.config, request, key, scope)
        return Claim.from_row(conn.execute(sql, params).fetchone())

    def _run(self, handler: Callable[[Context], Response], ctx: Context) -> Response:
        """The handler's answer; an exception (not a database outage) becomes a 500."""
        try:
            return handler(ctx)
        except Exception as e:
            if _db_trouble(e):
                raise
            if not isinstance(e, core.HandlerFailed):
                core.log.exception("idempotency: the handler raised")
            raise _Outcome(core.internal_error(self.config)) from e

    def _inbox(self, conn: psycopg.Connection, request: Request, key: str, scope: str, handler: Callable[[Context], Response]) -> Response:
        cfg = self.config
        try:
            with conn.transaction():
                claim = self._claim(conn, request, key, scope)
                if not claim.owned:
                    return core.answer(cfg, claim)
                ctx = Context(conn, key, scope, claim.token, claim.status, claim.attempts, claim.recovery_point, "inbox")  # type: ignore[arg-type]
                try:
                    with conn.transaction():  # a savepoint: a failed handler's writes go, the claim stays
                        response = self._run(handler, ctx)
                        if response.status >= 500 and not cfg.store_errors:
                            raise _Outcome(response)
                except _Outcome as o:
                    if not cfg.store_errors:
                        raise
                    response = o.response
                conn.execute(core.COMPLETE_SQL, core.complete_params(key, claim.token, scope, response))  # type: ignore[arg-type]
                return response
        except _Outcome as o:  # rolled back: claim and writes are gone, a retry runs afresh
            return o.response

    def _two_phase(self, conn: psycopg.Connection, request: Request, key: str, scope: str, handler: Callable[[Context], Response]) -> Response:
        cfg = self.config

        def claim_tx() -> Claim:
            with conn.transaction():
                return self._claim(conn, request, key, scope)

        claim = self._retrying(claim_tx)
        if not claim.owned:
            return core.answer(cfg, claim)
        ctx = Context(conn, key, scope, claim.token, claim.status, claim.attempts, claim.recovery_point, "two_phase")  # type: ignore[arg-type]
        params = {"key": key, "token": claim.token, "scope": scope}
        try:
            response = self._run(handler, ctx)
        except _Outcome as o:
            response = o.response
            failed = True
        else:
            failed = response.status >= 500
        if failed and not cfg.store_errors:
            self._retrying(lambda: conn.execute(core.RELEASE_SQL, params))  # the next claim is reclaimed at once
            return response

        def complete_tx() -> None:
            with conn.transaction():
                conn.execute(core.COMPLETE_SQL, core.complete_params(key, claim.token, scope, response))  # type: ignore[arg-type]

        try:
            self._retrying(complete_tx)
        except psycopg.Error as e:
            # The effect happened; the key stays claimed until its lease ends (then reclaimed).
            core.log.warning("idempotency: could not store the answer under %r: %s", key, e)
        return response


class AsyncIdempotency:
    """The asynchronous engine (ASGI): the same flow over psycopg's AsyncConnection."""

    def __init__(self, conninfo: str = "", config: Optional[Config] = None, *, pool: Optional[core.AsyncPool] = None) -> None:
        self.config = config or Config()
        self.pool = pool or core.AsyncPool(conninfo, self.config.pool_size, self.config.pool_timeout)

    def policy_response(self) -> Response:
        return core.policy_response(self.config)

    def applies_to(self, method: str) -> bool:
        return method.upper() in self.config.required_for

    async def handle(self, request: Request, handler: Callable[[AsyncContext], Awaitable[Response]]) -> Response:
        cfg = self.config
        try:
            key = parse_key(request.header(cfg.header), cfg.max_key_length)
        except InvalidKey as e:
            return core.problem(cfg, 400, e.title, e.detail)
        if cfg.max_body_bytes is not None and len(request.body) > cfg.max_body_bytes:
            return core.body_too_large(cfg)
        scope = cfg.scope(request)
        try:
            async with self.pool.connection() as conn:
                if cfg.mode == "inbox":
                    return await self._retrying(lambda: self._inbox(conn, request, key, scope, handler))
                return await self._two_phase(conn, request, key, scope, handler)
        except psycopg.Error as e:
            return core.error_response(cfg, e)

    async def _retrying(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        for attempt in range(self.config.retries + 1):
            try:
                return await fn()
            except psycopg.Error as e:
                if core.classify(e) != RETRY or attempt == self.config.retries:
                    raise

    async def _claim(self, conn: psycopg.AsyncConnection, request: Request, key: str, scope: str) -> Claim:
        sql, params = core.claim_params(self.config, request, key, scope)
        cur = await conn.execute(sql, params)
        return Claim.from_row(await cur.fetchone())  # type: ignore[arg-type]

    async def _run(self, handler: Callable[[AsyncContext], Awaitable[Response]], ctx: AsyncContext) -> Response:
        try:
            return await handler(ctx)
        except Exception as e:
            if _db_trouble(e):
                raise
            if not isinstance(e, core.HandlerFailed):
                core.log.exception("idempotency: the handler raised")
            raise _Outcome(core.internal_error(self.config)) from e

    async def _inbox(self, conn: psycopg.AsyncConnection, request: Request, key: str, scope: str, handler: Callable[[AsyncContext], Awaitable[Response]]) -> Response:
        cfg = self.config
        try:
            async with conn.transaction():
                claim = await self._claim(conn, request, key, scope)
                if not claim.owned:
                    return core.answer(cfg, claim)
                ctx = AsyncContext(conn, key, scope, claim.token, claim.status, claim.attempts, claim.recovery_point, "inbox")  # type: ignore[arg-type]
                try:
                    async with conn.transaction():
                        response = await self._run(handler, ctx)
                        if response.status >= 500 and not cfg.store_errors:
                            raise _Outcome(response)
                except _Outcome as o:
                    if not cfg.store_errors:
                        raise
                    response = o.response
                await conn.execute(core.COMPLETE_SQL, core.complete_params(key, claim.token, scope, response))  # type: ignore[arg-type]
                return response
        except _Outcome as o:
            return o.response

    async def _two_phase(self, conn: psycopg.AsyncConnection, request: Request, key: str, scope: str, handler: Callable[[AsyncContext], Awaitable[Response]]) -> Response:
        cfg = self.config

        async def claim_tx() -> Claim:
            async with conn.transaction():
                return await self._claim(conn, request, key, scope)

        claim = await self._retrying(claim_tx)
        if not claim.owned:
            return core.answer(cfg, claim)
        ctx = AsyncContext(conn, key, scope, claim.token, claim.status, claim.attempts, claim.recovery_point, "two_phase")  # type: ignore[arg-type]
        params = {"key": key, "token": claim.token, "scope": scope}
        try:
            response = await self._run(handler, ctx)
        except _Outcome as o:
            response = o.response
            failed = True
        else:
            failed = response.status >= 500
        if failed and not cfg.store_errors:
            await self._retrying(lambda: conn.execute(core.RELEASE_SQL, params))
            return response

        async def complete_tx() -> None:
            async with conn.transaction():
                await conn.execute(core.COMPLETE_SQL, core.complete_params(key, claim.token, scope, response))  # type: ignore[arg-type]

        try:
            await self._retrying(complete_tx)
        except psycopg.Error as e:
            core.log.warning("idempotency: could not store the answer under %r: %s", key, e)
        return response
