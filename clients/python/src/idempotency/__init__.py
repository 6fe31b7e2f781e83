"""Idempotency-Key middleware and message-consumer helpers over the idempotency extension.

    from idempotency import Config, Idempotency, AsyncIdempotency, parse_key

Adapters: idempotency.asgi (Starlette, FastAPI), idempotency.flask, idempotency.django;
consumers: idempotency.consumer (RabbitMQ with pika).
"""

from .core import Claim, Config, HandlerFailed, Request, Response, classify, policy_response, problem
from .engine import AsyncContext, AsyncIdempotency, Context, Idempotency
from .keys import MAX_KEY_BYTES, InvalidKey, parse_key

__version__ = "1.3.0"
__all__ = [
    "AsyncContext", "AsyncIdempotency", "Claim", "Config", "Context", "HandlerFailed", "Idempotency",
    "InvalidKey", "MAX_KEY_BYTES", "Request", "Response", "classify", "parse_key", "policy_response", "problem",
]
