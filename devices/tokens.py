"""Device WebSocket tokens: pure sign and verify, no ORM, no settings.

Format (compatible with the reference servers' `<signature>.<ts>`, plus a generation):

    <base64url-nopad(HMAC-SHA256(secret, f"{client_id}|{device_id}|{ts}|{generation}"))>.<ts>

`ts` is the issue time in Unix seconds, `device_id` the lowercase MAC. The generation is not
carried in the token: the verifier supplies the device's current one, so bumping it in the
database revokes every token issued before.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from enum import StrEnum

# A clock that runs a little ahead on another server must not lock devices out.
FUTURE_SKEW_SECONDS = 300
# Older generations checked to tell "revoked" from "forged"; HMACs are cheap, but bounded.
REVOKED_LOOKBACK = 16

_SIGNATURE = re.compile(r"[A-Za-z0-9_-]{43}")  # 32-byte digest, base64url without padding
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


class TokenStatus(StrEnum):
    VALID = "valid"
    MALFORMED = "malformed"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    FROM_FUTURE = "from_future"


@dataclass(frozen=True)
class TokenCheck:
    status: TokenStatus
    issued_at: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is TokenStatus.VALID


def _signature(*, secret: str, client_id: str, device_id: str, issued_at: int, generation: int) -> str:
    message = f"{client_id}|{device_id}|{issued_at}|{generation}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def token_sign(*, secret: str, client_id: str, device_id: str, issued_at: int, generation: int) -> str:
    signature = _signature(
        secret=secret, client_id=client_id, device_id=device_id, issued_at=issued_at, generation=generation
    )
    return f"{signature}.{issued_at}"


def _split(token: str) -> tuple[str, int] | None:
    parts = token.split(".")
    if len(parts) != 2:
        return None
    signature, timestamp = parts
    if not _SIGNATURE.fullmatch(signature) or not _TIMESTAMP.fullmatch(timestamp):
        return None
    return signature, int(timestamp)


def token_verify(
    token: str,
    *,
    secret: str,
    client_id: str,
    device_id: str,
    generation: int,
    ttl_seconds: int,
    now: float,
) -> TokenCheck:
    """Check signature first, then age: only a genuine token is reported as expired."""
    parsed = _split(token)
    if parsed is None:
        return TokenCheck(TokenStatus.MALFORMED)
    signature, issued_at = parsed
    expected = _signature(
        secret=secret, client_id=client_id, device_id=device_id, issued_at=issued_at, generation=generation
    )
    if not hmac.compare_digest(signature, expected):
        return TokenCheck(TokenStatus.BAD_SIGNATURE, issued_at)
    if issued_at - now > FUTURE_SKEW_SECONDS:
        return TokenCheck(TokenStatus.FROM_FUTURE, issued_at)
    if now - issued_at > ttl_seconds:
        return TokenCheck(TokenStatus.EXPIRED, issued_at)
    return TokenCheck(TokenStatus.VALID, issued_at)


def token_generation_of(
    token: str, *, secret: str, client_id: str, device_id: str, current_generation: int
) -> int | None:
    """The earlier generation a token was signed for, if any (to say "revoked" clearly)."""
    parsed = _split(token)
    if parsed is None:
        return None
    signature, issued_at = parsed
    oldest = max(0, current_generation - REVOKED_LOOKBACK)
    for generation in range(current_generation - 1, oldest - 1, -1):
        expected = _signature(
            secret=secret, client_id=client_id, device_id=device_id, issued_at=issued_at, generation=generation
        )
        if hmac.compare_digest(signature, expected):
            return generation
    return None
