"""The framework-neutral part: configuration, the SQL, answers, errors, connection pools.

Every statement names the schema and types every parameter, so that it matches the
extension's functions exactly (an untyped request_fingerprint(x) would pick the text
overload, and JSON keys in another order would give 422 instead of a replay).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import hashlib
import json
import logging
import math
import os
import queue
import threading
import urllib.parse
import uuid
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import psycopg
from psycopg.types.json import Jsonb

log = logging.getLogger("idempotency")

Headers = List[Tuple[str, str]]

# Not stored with a response (RFC 9110 7.6.1 hop-by-hop, and what the server sets itself).
UNSTORED_HEADERS = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
        "TE", "Trailer", "Transfer-Encoding", "Upgrade", "Date", "Content-Length", "Server",
        "Idempotent-Replayed",
    )
)
REPLAY_HEADER = "Idempotent-Replayed"


@dataclasses.dataclass
class Request:
    """What the middleware needs of an HTTP request; `native` is the framework's own object."""

    method: str
    path: str
    headers: Headers
    body: bytes = b""
    native: Any = None

    def header(self, name: str) -> Optional[str]:
        """The first value of header NAME (any case), or None."""
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None


@dataclasses.dataclass
class Response:
    """A complete response: status, headers (in order, repeats allowed), body bytes."""

    status: int
    headers: Headers = dataclasses.field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> Optional[str]:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None


def _default_scope(request: Request) -> str:
    return ""


@dataclasses.dataclass
class Config:
    """How the middleware behaves. Every field has a default; from_env() reads IDEM_*.

    mode            "inbox": the handler runs in the claim's transaction (its writes commit
                    with the key); "two_phase": claim and COMMIT, run the handler (outside
                    effects), complete in a new transaction; release on a failure.
    store_errors    store 5xx answers and handler exceptions (as 500), as Stripe does;
                    default: not stored, the retry runs afresh.
    wait_ms         0: a request in flight gets 409 with Retry-After; N: wait up to N ms for
                    it to finish, then replay (or 409).
    lease_seconds   the two-phase lease (how long a crashed holder blocks the key).
    ttl_seconds     how long keys are kept; published by the policy document.
    required_for    methods that must carry a key; other methods pass through untouched.
    policy_url      the `type` of every problem answer: where clients read the key policy.
    scope           hook: the authenticated client of a request (tenants never share keys).
    fingerprint     hook: bytes (or None: not checked) for a request; default: SHA-256 over
                    method, path and body, a JSON body as jsonb (key order does not matter).
    retries         how often a transaction that hit 40001 / 40P01 is run again.
    max_body_bytes  the largest request body read (413 above it); None: no limit.
    """

    mode: str = "inbox"
    store_errors: bool = False
    wait_ms: int = 0
    lease_seconds: float = 30.0
    ttl_seconds: int = 86400
    header: str = "Idempotency-Key"
    required_for: Tuple[str, ...] = ("POST", "PATCH")
    max_key_length: int = 255
    policy_url: str = "/idempotency-policy"
    scope: Callable[[Request], str] = _default_scope
    fingerprint: Optional[Callable[[Request], Optional[bytes]]] = None
    retries: int = 3
    max_body_bytes: Optional[int] = 1 << 20
    pool_size: int = 20
    pool_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.mode not in ("inbox", "two_phase"):
            raise ValueError(f"mode must be 'inbox' or 'two_phase', not {self.mode!r}")
        if self.wait_ms < 0 or self.lease_seconds <= 0 or self.ttl_seconds <= 0:
            raise ValueError("wait_ms must be >= 0, lease_seconds and ttl_seconds > 0")
        self.required_for = tuple(m.upper() for m in self.required_for)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None, **overrides: Any) -> "Config":
        """IDEM_MODE, IDEM_STORE_ERRORS, IDEM_WAIT_MS, IDEM_LEASE_SECONDS, IDEM_TTL_SECONDS."""
        env = os.environ if environ is None else environ
        kw: Dict[str, Any] = {}
        if env.get("IDEM_MODE"):
            kw["mode"] = env["IDEM_MODE"]
        if env.get("IDEM_STORE_ERRORS"):
            kw["store_errors"] = env["IDEM_STORE_ERRORS"] not in ("0", "false", "no", "")
        if env.get("IDEM_WAIT_MS"):
            kw["wait_ms"] = int(env["IDEM_WAIT_MS"])
        if env.get("IDEM_LEASE_SECONDS"):
            kw["lease_seconds"] = float(env["IDEM_LEASE_SECONDS"])
        if env.get("IDEM_TTL_SECONDS"):
            kw["ttl_seconds"] = int(env["IDEM_TTL_SECONDS"])
        kw.update(overrides)
        return cls(**kw)

    @property
    def policy_path(self) -> str:
        """Where the adapters serve the policy document: the path of policy_url."""
        return urllib.parse.urlsplit(self.policy_url).path or "/idempotency-policy"

    def policy(self) -> Dict[str, Any]:
        """The published key policy (serve it at policy_url)."""
        return {
            "header": self.header,
            "required_for": list(self.required_for),
            "max_length": self.max_key_length,
            "ttl_seconds": self.ttl_seconds,
        }


def policy_response(config: Config) -> Response:
    """The policy document as a 200 application/json response."""
    return Response(200, [("Content-Type", "application/json")], json.dumps(config.policy()).encode())


def body_too_large(config: Config) -> Response:
    return problem(config, 413, "Request body too large",
                   f"This API reads request bodies of at most {config.max_body_bytes} bytes.")


def problem(config: Config, status: int, title: str, detail: str, extra: Optional[Headers] = None) -> Response:
    """An RFC 9457 problem answer whose `type` links to the key policy."""
    body = {"type": config.policy_url, "title": title, "status": status, "detail": detail}
    return Response(status, [("Content-Type", "application/problem+json")] + list(extra or []), json.dumps(body).encode())


# --- the fingerprint ----------------------------------------------------------------------


def is_json(request: Request) -> bool:
    """A body whose Content-Type is JSON (application/json, */*+json) and that parses."""
    ctype = (request.header("Content-Type") or "").split(";")[0].strip().lower()
    if not (ctype == "application/json" or ctype.endswith("+json")):
        return False
    try:
        json.loads(request.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return False
    return True


def bytes_fingerprint(request: Request) -> bytes:
    """SHA-256 over method, path and body, each length-prefixed (no two requests collide)."""
    h = hashlib.sha256()
    for part in (request.method.upper().encode(), request.path.encode("utf-8", "surrogateescape"), request.body):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.digest()


# --- SQL ----------------------------------------------------------------------------------

_CLAIM_COLUMNS = (
    "status::text, token, response, response_code, response_body, response_headers, "
    "recovery_point, attempts, extract(epoch FROM retry_after)::float8"
)
# The JSON body as jsonb, inside an array with method and path: the typed overload.
CLAIM_JSON_SQL = (
    f"SELECT {_CLAIM_COLUMNS} FROM idempotency.claim_key(%(key)s::text, "
    "idempotency.request_fingerprint(jsonb_build_array(%(method)s::text, %(path)s::text, %(body)s::jsonb)), "
    "scope => %(scope)s::text, ttl => %(ttl)s::interval, lease => %(lease)s::interval, wait => %(wait)s::interval)"
)
CLAIM_SQL = (
    f"SELECT {_CLAIM_COLUMNS} FROM idempotency.claim_key(%(key)s::text, %(fingerprint)s::bytea, "
    "scope => %(scope)s::text, ttl => %(ttl)s::interval, lease => %(lease)s::interval, wait => %(wait)s::interval)"
)
COMPLETE_SQL = (
    "SELECT status::text FROM idempotency.complete_key(%(key)s::text, %(token)s::uuid, NULL::jsonb, "
    "%(code)s::int, scope => %(scope)s::text, response_body => %(body)s::bytea, "
    "response_headers => %(headers)s::jsonb)"
)
RELEASE_SQL = "SELECT idempotency.release_key(%(key)s::text, %(token)s::uuid, scope => %(scope)s::text)"
CHECKPOINT_SQL = (
    "SELECT idempotency.checkpoint_key(%(key)s::text, %(token)s::uuid, %(point)s::text, "
    "scope => %(scope)s::text)"
)


@dataclasses.dataclass
class Claim:
    """One row of claim_key (or claim_keys)."""

    status: str
    token: Optional[uuid.UUID] = None
    response: Any = None
    response_code: Optional[int] = None
    response_body: Optional[bytes] = None
    response_headers: Optional[Dict[str, Any]] = None
    recovery_point: Optional[str] = None
    attempts: Optional[int] = None
    retry_after: Optional[float] = None

    @property
    def owned(self) -> bool:
        """claimed or reclaimed: the key is ours, run the work."""
        return self.status in ("claimed", "reclaimed")

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> "Claim":
        body = row[4]
        return cls(row[0], row[1], row[2], row[3], bytes(body) if body is not None else None, row[5], row[6], row[7], row[8])


def claim_params(config: Config, request: Request, key: str, scope: str) -> Tuple[str, Dict[str, Any]]:
    """The claim statement and its parameters for REQUEST."""
    params: Dict[str, Any] = {
        "key": key,
        "scope": scope,
        "ttl": _dt.timedelta(seconds=config.ttl_seconds),
        "lease": _dt.timedelta(seconds=config.lease_seconds) if config.mode == "two_phase" else None,
        "wait": _dt.timedelta(milliseconds=config.wait_ms),
    }
    if config.fingerprint is not None:
        params["fingerprint"] = config.fingerprint(request)
        return CLAIM_SQL, params
    if is_json(request):
        params.update(method=request.method.upper(), path=request.path, body=request.body.decode("utf-8"))
        return CLAIM_JSON_SQL, params
    params["fingerprint"] = bytes_fingerprint(request)
    return CLAIM_SQL, params


def stored_headers(headers: Headers) -> Dict[str, Union[str, List[str]]]:
    """The headers to store: all but hop-by-hop, Date, Content-Length; repeats as arrays."""
    out: Dict[str, Union[str, List[str]]] = {}
    names: Dict[str, str] = {}
    for k, v in headers:
        if k.lower() in UNSTORED_HEADERS:
            continue
        name = names.setdefault(k.lower(), k)
        if name in out:
            prev = out[name]
            out[name] = (prev if isinstance(prev, list) else [prev]) + [v]
        else:
            out[name] = v
    return out


def complete_params(key: str, token: uuid.UUID, scope: str, response: Response) -> Dict[str, Any]:
    return {
        "key": key,
        "token": token,
        "scope": scope,
        "code": response.status,
        "body": response.body,
        "headers": Jsonb(stored_headers(response.headers)),
    }


def replay_response(claim: Claim) -> Response:
    """The stored answer, byte for byte, with Idempotent-Replayed: true."""
    headers: Headers = []
    for k, v in (claim.response_headers or {}).items():
        for item in v if isinstance(v, list) else [v]:
            headers.append((k, item))
    if claim.response_body is not None:
        body = claim.response_body
    elif claim.response is not None:  # stored by a client that kept a jsonb answer only
        body = json.dumps(claim.response).encode()
        if not any(k.lower() == "content-type" for k, _ in headers):
            headers.append(("Content-Type", "application/json"))
    else:
        body = b""
    headers.append((REPLAY_HEADER, "true"))
    return Response(claim.response_code or 200, headers, body)


def retry_after_seconds(seconds: Optional[float]) -> str:
    return str(max(1, math.ceil(seconds or 1)))


def answer(config: Config, claim: Claim) -> Response:
    """The HTTP answer to a claim the handler does not run for."""
    if claim.status == "replay":
        return replay_response(claim)
    if claim.status == "in_progress":
        return problem(
            config, 409, "Request in progress",
            "A request with this Idempotency-Key is still being processed; retry later.",
            [("Retry-After", retry_after_seconds(claim.retry_after))],
        )
    if claim.status == "mismatch":
        return problem(
            config, 422, "Idempotency-Key reused",
            "This Idempotency-Key was used for another request (method, path or body differ).",
        )
    raise AssertionError(f"no answer for status {claim.status}")


# --- errors ------------------------------------------------------------------------------

RETRY, UNAVAILABLE, BAD_REQUEST, TOO_LARGE, SETUP, OTHER = (
    "retry", "unavailable", "bad_request", "too_large", "setup", "other")
_CITUS_TRANSIENT = "cannot execute a distributed query from a query on a shard"


def classify(exc: BaseException) -> str:
    """What an exception from the database means for the request."""
    if not isinstance(exc, psycopg.Error):
        return OTHER
    state = exc.sqlstate or ""
    if state in ("40001", "40P01") or (state == "XX000" and _CITUS_TRANSIENT in str(exc)):
        return RETRY
    if state.startswith("08") or state in ("57P01", "57P02", "57P03"):
        return UNAVAILABLE
    if not state and isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError)):
        return UNAVAILABLE  # the connection is gone, or none could be made
    if state in ("22001", "22023", "22P02", "22004"):
        return BAD_REQUEST
    if state == "54000":
        return TOO_LARGE
    if state == "42501":
        return SETUP
    return OTHER


def error_response(config: Config, exc: BaseException) -> Response:
    """SQLSTATEs to HTTP: 22001/22023/22P02 400, 54000 413, 40001/40P01/08xxx/57P0x 503, else 500."""
    kind = classify(exc)
    if kind == BAD_REQUEST:
        return problem(config, 400, "Invalid idempotency request", str(exc).split("\n")[0])
    if kind == TOO_LARGE:
        return problem(config, 413, "Response too large to store", str(exc).split("\n")[0])
    if kind in (RETRY, UNAVAILABLE):
        log.warning("idempotency: database unavailable: %s", exc)
        return problem(config, 503, "Service unavailable", "The database is unavailable; retry later.", [("Retry-After", "1")])
    if kind == SETUP:
        log.error("idempotency: set-up error (GRANT USAGE ON SCHEMA idempotency to this role?): %s", exc)
    else:
        log.error("idempotency: %s", exc)
    return problem(config, 500, "Internal error", "Nothing was stored; retrying with the same key is safe.")


def internal_error(config: Config) -> Response:
    return problem(config, 500, "Internal error", "The handler failed.")


class HandlerFailed(Exception):
    """Raised by an adapter's handler callable to say: the application raised (turn into 500)."""


# --- connection pools ---------------------------------------------------------------------


class Pool:
    """A small thread-safe pool of autocommit connections; broken connections are dropped."""

    def __init__(self, conninfo: str = "", size: int = 20, timeout: float = 30.0,
                 connect: Optional[Callable[[], psycopg.Connection]] = None) -> None:
        self._connect = connect or (lambda: psycopg.connect(conninfo, autocommit=True))
        self._idle: "queue.LifoQueue[psycopg.Connection]" = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._timeout = timeout

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        if not self._slots.acquire(timeout=self._timeout):
            raise psycopg.OperationalError("no free connection in the idempotency pool")
        conn = None
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = self._connect()
            conn.autocommit = True
            yield conn
        finally:
            if conn is not None:
                if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.close()  # broken, or left inside a transaction: never reuse
                else:
                    self._idle.put(conn)
            self._slots.release()

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return


class AsyncPool:
    """The asyncio twin of Pool."""

    def __init__(self, conninfo: str = "", size: int = 20, timeout: float = 30.0,
                 connect: Optional[Callable[[], Any]] = None) -> None:
        self._connect = connect or (lambda: psycopg.AsyncConnection.connect(conninfo, autocommit=True))
        self._idle: List[psycopg.AsyncConnection] = []
        self._size = size
        self._slots: Optional[asyncio.Semaphore] = None
        self._timeout = timeout

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._size)
        try:
            await asyncio.wait_for(self._slots.acquire(), self._timeout)
        except asyncio.TimeoutError:
            raise psycopg.OperationalError("no free connection in the idempotency pool") from None
        conn = None
        try:
            conn = self._idle.pop() if self._idle else await self._connect()
            await conn.set_autocommit(True)
            yield conn
        finally:
            if conn is not None:
                if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    await conn.close()
                else:
                    self._idle.append(conn)
            self._slots.release()

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().close()
