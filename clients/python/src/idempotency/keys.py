"""The Idempotency-Key header: a Structured Field string, or a bare token.

No database needed: the adapters reject a bad key with 400 before they connect.
"""

from __future__ import annotations

import string
from typing import Optional

MAX_KEY_BYTES = 255  # idempotency.max_key_length's default

# RFC 9110 tchar, plus ':' and '/' (RFC 8941 sf-token's extra characters), so that a bare
# UUID, a bare ULID or "order:42/retry" are accepted as clients send them.
_BARE = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~" + ":/")


class InvalidKey(ValueError):
    """The Idempotency-Key header is missing, empty, malformed or too long (HTTP 400)."""

    def __init__(self, title: str, detail: str) -> None:
        super().__init__(detail)
        self.title = title
        self.detail = detail


def parse_key(value: Optional[str], max_bytes: int = MAX_KEY_BYTES) -> str:
    """Returns the key that the header value VALUE carries, or raises InvalidKey.

    Accepted: a Structured Field string (RFC 8941 3.3.3: "abc", with \\" and \\\\ escapes,
    printable ASCII only) or a bare token (RFC 9110 tchar plus ':' and '/'). The key is 1 to
    MAX_BYTES bytes after unquoting. Surrounding spaces and tabs are ignored (RFC 9110 5.5).
    """
    if value is None:
        raise InvalidKey("Idempotency-Key missing", "This request needs an Idempotency-Key header.")
    text = value.strip(" \t")
    if text.startswith('"'):
        key = _parse_sf_string(text)
    else:
        if text and not all(c in _BARE for c in text):
            raise InvalidKey(
                "Idempotency-Key malformed",
                "The Idempotency-Key must be a quoted string (\"...\") of printable ASCII "
                "or a token of letters, digits and !#$%&'*+-.^_`|~:/ characters.",
            )
        key = text
    if not key:
        raise InvalidKey("Idempotency-Key empty", "The Idempotency-Key must not be empty.")
    size = len(key.encode("ascii"))
    if size > max_bytes:
        raise InvalidKey(
            "Idempotency-Key too long",
            f"The Idempotency-Key is {size} bytes long; at most {max_bytes} are accepted.",
        )
    return key


def _parse_sf_string(text: str) -> str:
    out = []
    i = 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            if i + 1 < len(text) and text[i + 1] in '"\\':
                out.append(text[i + 1])
                i += 2
                continue
            raise InvalidKey(
                "Idempotency-Key malformed",
                'In a quoted Idempotency-Key a backslash may only escape " or \\.',
            )
        if c == '"':
            if i != len(text) - 1:
                raise InvalidKey(
                    "Idempotency-Key malformed",
                    "The quoted Idempotency-Key has characters after its closing quote.",
                )
            return "".join(out)
        if not " " <= c <= "~":
            raise InvalidKey(
                "Idempotency-Key malformed",
                "A quoted Idempotency-Key may hold printable ASCII characters only.",
            )
        out.append(c)
        i += 1
    raise InvalidKey("Idempotency-Key malformed", "The quoted Idempotency-Key has no closing quote.")
