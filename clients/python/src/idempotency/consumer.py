"""RabbitMQ consumers (pika) whose effects happen once, however often a message is delivered.

    consumer = Consumer(DATABASE_URL, handler, mode="single")   # or "batch", "two_phase"
    consumer.run(pika.URLParameters(AMQP_URL), "payments")

The key of a message is its `Idempotency-Key` header, else its AMQP message_id (never the
delivery tag: it changes on redelivery). Per mode:

single     BEGIN; claim_key; handler(ctx) (its writes through ctx.connection); complete_key;
           COMMIT; then ack.
batch      up to `prefetch` deliveries: BEGIN; claim_keys; handler(ctx) per claimed message
           (each in a savepoint); complete_keys; one COMMIT; then one multiple ack.
two_phase  BEGIN; claim_key (with a lease); COMMIT; handler(ctx) (outside effects; ctx.connection
           autocommits; ctx.checkpoint(point) records progress); complete_key; then ack.

replay -> ack (the effect is there). in_progress -> requeued after retry_after (the message is
held meanwhile: no hot loop). mismatch -> rejected without requeue (the queue's dead-letter
exchange gets it: a poison message never loops). A database error -> nack with requeue, after
a back-off. The handler raising Retry -> released and requeued (after the back-off); raising
anything else -> released and rejected without requeue (dead-lettered). A message with no key
is dead-lettered. SIGTERM (or stop()) ends the loop after the message or batch in hand; the
deliveries not yet processed go back to the queue when the channel closes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import threading
import uuid
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import psycopg
from psycopg.types.json import Jsonb

from . import core

log = logging.getLogger("idempotency.consumer")

ACK, REQUEUE, LATER, REJECT = "ack", "requeue", "later", "reject"


class Retry(Exception):
    """Raise from a handler for a transient failure: the key is released, the message requeued."""


@dataclasses.dataclass
class Delivery:
    """One message as the broker gave it: pika's method frame, properties and body."""

    method: Any
    properties: Any
    body: bytes

    @property
    def tag(self) -> int:
        return int(self.method.delivery_tag)

    @property
    def key(self) -> Optional[str]:
        headers = getattr(self.properties, "headers", None) or {}
        for name, value in headers.items():
            if name.lower() == "idempotency-key" and value:
                return value.decode() if isinstance(value, bytes) else str(value)
        return getattr(self.properties, "message_id", None) or None

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return json.loads(self.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return None


@dataclasses.dataclass
class MessageContext:
    """What the handler gets: the delivery, the claim, and the connection its writes must use
    (single, batch: inside the claim's transaction; two_phase: autocommit, after the claim's
    COMMIT)."""

    connection: psycopg.Connection
    delivery: Delivery
    key: str
    scope: str
    token: uuid.UUID
    status: str
    attempts: Optional[int]
    recovery_point: Optional[str]
    mode: str

    @property
    def body(self) -> bytes:
        return self.delivery.body

    def checkpoint(self, recovery_point: str) -> None:
        """two_phase: records progress and renews the lease."""
        if self.mode != "two_phase":
            raise RuntimeError("checkpoints are for two-phase handlers")
        with self.connection.transaction():
            self.connection.execute(core.CHECKPOINT_SQL, {"key": self.key, "token": self.token, "point": recovery_point, "scope": self.scope})
        self.recovery_point = recovery_point


Handler = Callable[[MessageContext], Any]

_COLUMNS = "status::text, token, recovery_point, attempts, extract(epoch FROM retry_after)::float8"
_CLAIM_ONE = (
    f"SELECT {_COLUMNS} FROM idempotency.claim_key(%(key)s::text, "
    "CASE WHEN %(doc)s::jsonb IS NOT NULL THEN idempotency.request_fingerprint(%(doc)s::jsonb) "
    "ELSE idempotency.request_fingerprint(%(raw)s::bytea) END, "
    "scope => %(scope)s::text, ttl => %(ttl)s::interval, lease => %(lease)s::interval)"
)
_CLAIM_MANY = (
    f"SELECT key, {_COLUMNS} FROM idempotency.claim_keys(%(keys)s::text[], "
    "ARRAY(SELECT CASE WHEN d IS NOT NULL THEN idempotency.request_fingerprint(d) "
    "ELSE idempotency.request_fingerprint(r) END "
    "FROM unnest(%(docs)s::jsonb[], %(raws)s::bytea[]) WITH ORDINALITY AS u(d, r, n) ORDER BY n), "
    "scope => %(scope)s::text, ttl => %(ttl)s::interval, lease => %(lease)s::interval) ORDER BY ordinality"
)
_COMPLETE_ONE = (
    "SELECT status::text FROM idempotency.complete_key(%(key)s::text, %(token)s::uuid, %(response)s::jsonb, "
    "scope => %(scope)s::text)"
)
_COMPLETE_MANY = (
    "SELECT count(*) FROM idempotency.complete_keys(%(keys)s::text[], %(tokens)s::uuid[], "
    "%(responses)s::jsonb[], scope => %(scope)s::text)"
)


def _doc_text(d: Delivery) -> Optional[str]:
    """The body's text when it is JSON (fingerprinted as jsonb: key order does not matter)."""
    return d.body.decode("utf-8") if d.json() is not None or d.body.strip() == b"null" else None


class Consumer:
    """A consumer of one queue. See the module's documentation for what each answer does.

    on_commit(deliveries): called after each COMMIT, before the ack (tests crash there).
    sleep(seconds): how the consumer waits (run() uses the connection's sleep, which keeps
    heartbeats going); requeue_delay_max caps the wait before an in_progress requeue.
    """

    def __init__(self, conninfo: str, handler: Handler, *, mode: str = "single", prefetch: int = 50,
                 scope: str = "", ttl_seconds: Optional[float] = None, lease_seconds: Optional[float] = None,
                 retries: int = 3, requeue_delay_max: float = 5.0, backoff_max: float = 5.0,
                 on_commit: Optional[Callable[[Sequence[Delivery]], None]] = None,
                 connect: Optional[Callable[[], psycopg.Connection]] = None) -> None:
        if mode not in ("single", "batch", "two_phase"):
            raise ValueError(f"mode must be single, batch or two_phase, not {mode!r}")
        self.mode, self.handler, self.prefetch, self.scope = mode, handler, prefetch, scope
        self.ttl = None if ttl_seconds is None else _secs(ttl_seconds)
        self.lease = None if lease_seconds is None else _secs(lease_seconds)
        self.retries, self.requeue_delay_max, self.backoff_max = retries, requeue_delay_max, backoff_max
        self.on_commit = on_commit
        self._connect = connect or (lambda: psycopg.connect(conninfo, autocommit=True))
        self._conn: Optional[psycopg.Connection] = None
        self._backoff = 0.0
        self._stop = threading.Event()
        self.sleep: Callable[[float], None] = lambda s: self._stop.wait(s) and None
        self.counts: Dict[str, int] = {}

    # --- the database connection -------------------------------------------------------------

    def _db(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
            self._conn.autocommit = True
        return self._conn

    def _drop_db(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def _count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def _retrying(self, fn: Callable[[], Any]) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except psycopg.Error as e:
                if core.classify(e) != core.RETRY or attempt == self.retries:
                    raise

    def _db_failed(self, exc: BaseException) -> None:
        log.warning("database error, requeueing: %s", exc)
        if core.classify(exc) == core.UNAVAILABLE or self._conn is None or self._conn.closed or \
                self._conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self._drop_db()
        self._backoff = min(self.backoff_max, max(0.1, self._backoff * 2))
        self.sleep(self._backoff)  # no hot loop while the database is away

    @staticmethod
    def _bad_message(exc: BaseException) -> bool:
        """An error of our own statements that the message causes (a body jsonb refuses, a
        key too long): retrying cannot help."""
        state = getattr(exc, "sqlstate", None) or ""
        return state.startswith("22") or state == "54000"

    # --- one message ------------------------------------------------------------------------

    def process_one(self, channel: Any, d: Delivery) -> str:
        """Processes one delivery and settles it on CHANNEL; returns what was done."""
        key = d.key
        if not key:
            log.error("a message without message_id or Idempotency-Key header: dead-lettered")
            return self._settle_one(channel, d, REJECT, "no_key")
        try:
            if self.mode == "two_phase":
                outcome, status, delay = self._two_phase(d, key)
            else:
                outcome, status, delay = self._retrying(lambda: self._inbox(d, key))
            self._backoff = 0.0
        except psycopg.Error as e:
            if self._bad_message(e):
                log.error("message %r refused by the database (%s): dead-lettered", key, e)
                return self._settle_one(channel, d, REJECT, "bad_message")
            self._db_failed(e)
            return self._settle_one(channel, d, REQUEUE, "db_error")
        if outcome == LATER:
            self.sleep(delay)
            outcome = REQUEUE
        return self._settle_one(channel, d, outcome, status)

    def _settle_one(self, channel: Any, d: Delivery, outcome: str, what: str) -> str:
        self._count(what)
        if outcome == ACK:
            channel.basic_ack(delivery_tag=d.tag)
        elif outcome == REQUEUE:
            channel.basic_nack(delivery_tag=d.tag, requeue=True)
        else:
            channel.basic_reject(delivery_tag=d.tag, requeue=False)
        return what

    def _claim_params(self, d: Delivery, key: str) -> Dict[str, Any]:
        return {"key": key, "doc": _doc_text(d), "raw": d.body, "scope": self.scope, "ttl": self.ttl, "lease": self.lease}

    def _answer(self, status: str, retry_after: Optional[float]) -> Tuple[str, str, float]:
        if status == "replay":
            return ACK, "replay", 0.0
        if status == "mismatch":
            return REJECT, "mismatch", 0.0
        return LATER, "in_progress", min(self.requeue_delay_max, max(0.1, retry_after or 1.0))

    def _failed(self, exc: Exception, key: str) -> Tuple[str, str, float]:
        if isinstance(exc, Retry):
            self._backoff = min(self.backoff_max, max(0.1, self._backoff * 2))
            return LATER, "retry", self._backoff
        log.exception("the handler failed on %r: dead-lettered", key)
        return REJECT, "handler_error", 0.0

    def _inbox(self, d: Delivery, key: str) -> Tuple[str, str, float]:
        conn = self._db()
        failed: Optional[Tuple[str, str, float]] = None
        with conn.transaction() as tx:
            status, token, point, attempts, retry_after = conn.execute(_CLAIM_ONE, self._claim_params(d, key)).fetchone()  # type: ignore[misc]
            if status not in ("claimed", "reclaimed"):
                return self._answer(status, retry_after)
            ctx = MessageContext(conn, d, key, self.scope, token, status, attempts, point, "single")
            try:
                response = self.handler(ctx)
            except Exception as e:
                if isinstance(e, psycopg.Error) and core.classify(e) in (core.RETRY, core.UNAVAILABLE):
                    raise
                failed = self._failed(e, key)
                raise psycopg.Rollback(tx)  # claim and writes go: a redelivery runs afresh
            conn.execute(_COMPLETE_ONE, {"key": key, "token": token, "response": _jsonb(response), "scope": self.scope})
        if failed is not None:
            return failed
        if self.on_commit:
            self.on_commit([d])
        return ACK, status, 0.0

    def _two_phase(self, d: Delivery, key: str) -> Tuple[str, str, float]:
        conn = self._db()

        def claim() -> Any:
            with conn.transaction():
                return conn.execute(_CLAIM_ONE, self._claim_params(d, key)).fetchone()

        status, token, point, attempts, retry_after = self._retrying(claim)
        if status not in ("claimed", "reclaimed"):
            return self._answer(status, retry_after)
        ctx = MessageContext(conn, d, key, self.scope, token, status, attempts, point, "two_phase")
        params = {"key": key, "token": token, "scope": self.scope}
        try:
            response = self.handler(ctx)
        except Exception as e:
            if isinstance(e, psycopg.Error) and core.classify(e) == core.UNAVAILABLE:
                raise  # the key stays claimed until its lease ends; the redelivery waits for it
            self._retrying(lambda: conn.execute(core.RELEASE_SQL, params))
            return self._failed(e, key)

        def complete() -> None:
            with conn.transaction():
                conn.execute(_COMPLETE_ONE, dict(params, response=_jsonb(response)))

        self._retrying(complete)
        if self.on_commit:
            self.on_commit([d])
        return ACK, status, 0.0

    # --- a batch ------------------------------------------------------------------------------

    def process_batch(self, channel: Any, batch: Sequence[Delivery]) -> List[str]:
        """Processes BATCH in one transaction and settles it: rejects and requeues one by one,
        then one multiple ack of the last delivery."""
        if not batch:
            return []
        keyed = [d for d in batch if d.key]
        outcomes: Dict[int, Tuple[str, str, float]] = {d.tag: (REJECT, "no_key", 0.0) for d in batch if not d.key}
        try:
            if keyed:
                outcomes.update(self._retrying(lambda: self._batch(keyed)))
            self._backoff = 0.0
        except psycopg.Error as e:
            if self._bad_message(e) and len(keyed) > 1:
                log.warning("a message of the batch was refused (%s): one by one", e)
                return [self.process_one(channel, d) for d in batch]
            if self._bad_message(e):
                return [self._settle_one(channel, keyed[0], REJECT, "bad_message")]
            self._db_failed(e)
            channel.basic_nack(delivery_tag=max(d.tag for d in batch), multiple=True, requeue=True)
            self._count("db_error", len(batch))
            return ["db_error"] * len(batch)
        later = [o[2] for o in outcomes.values() if o[0] == LATER]
        if later:
            self.sleep(max(later))
        ack_tag = None
        for d in batch:
            outcome, what, _ = outcomes[d.tag]
            self._count(what)
            if outcome == REJECT:
                channel.basic_reject(delivery_tag=d.tag, requeue=False)
            elif outcome in (REQUEUE, LATER):
                channel.basic_nack(delivery_tag=d.tag, requeue=True)
            else:
                ack_tag = d.tag if ack_tag is None else max(ack_tag, d.tag)
        if ack_tag is not None:
            channel.basic_ack(delivery_tag=ack_tag, multiple=True)
        return [outcomes[d.tag][1] for d in batch]

    def _batch(self, batch: Sequence[Delivery]) -> Dict[int, Tuple[str, str, float]]:
        conn = self._db()
        out: Dict[int, Tuple[str, str, float]] = {}
        with conn.transaction():
            rows = conn.execute(_CLAIM_MANY, {
                "keys": [d.key for d in batch], "docs": [_doc_text(d) for d in batch],
                "raws": [d.body for d in batch], "scope": self.scope, "ttl": self.ttl, "lease": self.lease,
            }).fetchall()
            first: Dict[str, int] = {}  # key -> delivery tag of its first occurrence
            repeats: List[Tuple[int, str]] = []
            done_keys: List[str] = []
            done_tokens: List[uuid.UUID] = []
            responses: List[Any] = []
            for d, (key, status, token, point, attempts, retry_after) in zip(batch, rows):
                assert key == d.key, "claim_keys answers in input order"
                if key in first and status == "in_progress":
                    repeats.append((d.tag, key))  # this transaction's own claim of the key
                    continue
                first.setdefault(key, d.tag)
                if status not in ("claimed", "reclaimed"):
                    out[d.tag] = self._answer(status, retry_after)
                    continue
                ctx = MessageContext(conn, d, key, self.scope, token, status, attempts, point, "batch")
                try:
                    with conn.transaction():  # a savepoint: one failing message does not sink the batch
                        response = self.handler(ctx)
                except psycopg.Error as e:
                    if core.classify(e) in (core.RETRY, core.UNAVAILABLE):
                        raise
                    conn.execute(core.RELEASE_SQL, {"key": key, "token": token, "scope": self.scope})
                    out[d.tag] = self._failed(e, key)
                    continue
                except Exception as e:
                    conn.execute(core.RELEASE_SQL, {"key": key, "token": token, "scope": self.scope})
                    out[d.tag] = self._failed(e, key)
                    continue
                done_keys.append(key)
                done_tokens.append(token)
                responses.append(_jsonb(response))
                out[d.tag] = (ACK, status, 0.0)
            if done_keys:
                conn.execute(_COMPLETE_MANY, {"keys": done_keys, "tokens": done_tokens, "responses": responses, "scope": self.scope})
        for tag, key in repeats:  # a repeat is settled as its first occurrence is
            outcome, _, delay = out[first[key]]
            out[tag] = (outcome, "repeat", delay)
        if self.on_commit:
            self.on_commit(batch)
        return out

    # --- the loop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ends run() after the message or batch in hand (safe from a signal handler)."""
        self._stop.set()

    def run(self, parameters: Any, queue: str, *, install_sigterm: bool = True) -> None:
        """Consumes QUEUE with manual acks until stop() or SIGTERM."""
        import pika

        if install_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        connection = pika.BlockingConnection(parameters)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=self.prefetch)
        self.sleep = lambda s: connection.sleep(s)  # keeps heartbeats going while it waits
        batch: List[Delivery] = []
        try:
            for method, properties, body in channel.consume(queue, inactivity_timeout=0.05):
                if method is not None:
                    d = Delivery(method, properties, body)
                    if self.mode == "batch":
                        batch.append(d)
                        if len(batch) < self.prefetch:
                            continue
                    else:
                        self.process_one(channel, d)
                if batch:
                    self.process_batch(channel, batch)
                    batch = []
                if self._stop.is_set():
                    break
        finally:
            # The batch in hand finished above; what is still prefetched goes back to the queue.
            if channel.is_open:
                channel.cancel()
                channel.close()
            if connection.is_open:
                connection.close()
            self._drop_db()


def _secs(seconds: float) -> Any:
    import datetime

    return datetime.timedelta(seconds=seconds)


def _jsonb(value: Any) -> Optional[Jsonb]:
    return None if value is None else Jsonb(value)
