"""Who may use the LLM Gateway, and how much: API keys, per-key limits (plain Python).

A client sends its key with the WebSocket handshake, as `Authorization: Bearer <key>` or, for
clients that cannot set headers (browsers, the seed's examples), as `?token=<key>` in the URL.
The consumer checks it before the connection takes a slot (CLOUD_MAX_CONNECTIONS) and before
any LLM or tool work; there is no unauthenticated state to linger in. The database side
(create, look up, revoke) is `keys.py`; this module has no ORM.

KeyLimits counts the per-key limits in this process: what a server without Redis (one web
process) uses. With REDIS_URL every web worker counts in Redis instead (limits.py), so the
limits hold across workers; CLOUD_MAX_CONNECTIONS stays per process (consumer.py).
"""
from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qs

from conversations.gateway import protocol

KEY_PREFIX = "xzgw_"
PREFIX_LENGTH = 12  # "xzgw_" and 7 random characters: shown in the admin to tell keys apart
MAX_KEY_LENGTH = 256  # longer credentials are refused without hashing them
_MAX_QUERY_FIELDS = 20

CLOSE_UNAUTHORIZED = 4001  # as the device WebSocket's "authentication failed"
CLOSE_TRY_AGAIN_LATER = 1013  # seed §11.1 (server full); also the key's connection cap


class AuthErrorCode(StrEnum):
    """Error codes the seed does not have (it has no authentication); same message shape."""

    UNAUTHORIZED = "UNAUTHORIZED"  # 401: no key, an unknown key or a revoked key
    RATE_LIMITED = "RATE_LIMITED"  # 429: the key's requests per minute or connections


def error_message(code: AuthErrorCode, message: str, details: str = "") -> dict[str, Any]:
    """An `error` message of seed §5.4 with one of our codes."""
    return protocol.error(code, message, details)  # type: ignore[arg-type]  # a str enum like ErrorCode


# -- keys -------------------------------------------------------------------------------------


def key_generate() -> str:
    """A new key: 256 random bits, URL-safe (it may travel in a query string)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    """What is stored: SHA-256 is enough for a random 256-bit key (no dictionary to try)."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_prefix(key: str) -> str:
    return key[:PREFIX_LENGTH]


def credential(scope: Mapping[str, Any]) -> str | None:
    """The key a handshake carries: `Authorization: Bearer …` first, else `?token=…`."""
    for name, value in scope.get("headers") or ():
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").strip().partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return _bounded(token.strip())
    query = scope.get("query_string") or b""
    if isinstance(query, bytes):
        query = query.decode("latin-1")
    try:
        tokens = parse_qs(query, max_num_fields=_MAX_QUERY_FIELDS).get("token") if query else None
    except ValueError:  # more fields than any client of ours sends
        return None
    return _bounded(tokens[0]) if tokens else None


def _bounded(token: str) -> str | None:
    return token if 0 < len(token) <= MAX_KEY_LENGTH else None


@dataclass(frozen=True)
class KeyGrant:
    """An authenticated key, as the consumer needs it (read once per connection)."""

    key_id: int
    name: str
    requests_per_minute: int
    max_connections: int
    system_prompt: str = ""  # from the key's persona; empty: the gateway's default prompt
    persona_id: int | None = None  # whose LLM chain the connection uses (None: the default persona's)
    prefix: str = ""  # the key's stored prefix: with key_id, names its counts in Redis (limits.py)


# -- per-key limits ------------------------------------------------------------------------------


@dataclass
class _Bucket:
    tokens: float
    updated: float


class KeyLimits:
    """Each key's live connections and its request rate, in this process (limits.py counts
    over all workers in Redis with the same rules).

    The rate is a token bucket: a key may send up to `requests_per_minute` text_input at once,
    and gets them back at that many per minute. The bucket outlives the key's connections,
    so reconnecting does not refill it.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._connections: dict[int, int] = {}
        self._buckets: dict[int, _Bucket] = {}

    def connections(self, key_id: int) -> int:
        return self._connections.get(key_id, 0)

    def open(self, grant: KeyGrant) -> bool:
        """Count a connection, unless the key already holds `max_connections`."""
        count = self._connections.get(grant.key_id, 0)
        if count >= grant.max_connections:
            return False
        self._connections[grant.key_id] = count + 1
        return True

    def close(self, key_id: int) -> None:
        count = self._connections.get(key_id, 0) - 1
        if count > 0:
            self._connections[key_id] = count
        else:
            self._connections.pop(key_id, None)

    def request(self, grant: KeyGrant) -> float:
        """Take one request: 0.0 when allowed, else the seconds until one is."""
        capacity = float(grant.requests_per_minute)
        per_second = capacity / 60.0
        now = self._clock()
        bucket = self._buckets.get(grant.key_id)
        if bucket is None:
            bucket = self._buckets[grant.key_id] = _Bucket(capacity, now)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.updated) * per_second)
        bucket.updated = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return 0.0
        return (1.0 - bucket.tokens) / per_second


def is_text_input(frame: str, max_bytes: int) -> bool:
    """Whether a frame is a `text_input` (the request that costs LLM credit), decided the way
    the session's parser will decide it. Frames that cannot be one are passed over without
    parsing: a JSON string can only spell "text_input" literally or with \\u escapes. A frame
    over the size limit is left to the session, which refuses it (1009)."""
    if "text_input" not in frame and "\\u" not in frame:
        return False
    if len(frame) > max_bytes or len(frame.encode("utf-8", "surrogatepass")) > max_bytes:
        return False
    try:
        data = json.loads(frame)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("type") == "text_input"
