"""Limits on what a device may send: a token bucket against floods, sizes, bad frames."""
from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from conversations.pipeline.config import SessionConfig
from conversations.pipeline.states import MAX_PROTOCOL_ERRORS, CloseCode
from devices.protocol.binary import AudioPacket, decode_audio
from devices.protocol.codec import decode_json
from devices.protocol.errors import ProtocolError
from devices.protocol.messages import Message

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
CloseFn = Callable[[int, str], Awaitable[None]]

# A burst of this many seconds' worth of frames is allowed: the firmware flushes its
# wake-word pre-roll (~33 frames) and, after a stall, its 40-packet send queue at once.
BURST_SECONDS = 2.0


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up; each frame takes one."""

    def __init__(self, rate: float, burst: float, clock: Clock = time.monotonic) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self._rate = float(rate)
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()

    def take(self) -> bool:
        """Spend one token; False when the bucket is empty (the caller is flooding)."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


def flood_bucket(max_messages_per_second: int, clock: Clock = time.monotonic) -> TokenBucket:
    """The session's bucket: uplink audio alone is ~17 frames/s at 60 ms."""
    rate = max(1, int(max_messages_per_second))
    return TokenBucket(rate, max(1.0, rate * BURST_SECONDS), clock)


class FrameGate:
    """Every incoming frame passes here first: flood bucket, size limits, decoding.

    Bad frames become a close (flood, too large, binary before hello) or a counted protocol
    error; the session only ever sees well-formed messages and Opus payloads.
    """

    def __init__(self, config: SessionConfig, close: CloseFn, clock: Clock = time.monotonic) -> None:
        self._config = config
        self._close = close
        self._bucket = flood_bucket(config.max_messages_per_second, clock)
        self.errors = 0

    async def text(self, text: str) -> Message | None:
        if not await self._admit():
            return None
        try:
            return decode_json(text, max_bytes=self._config.max_text_bytes)
        except ProtocolError as exc:
            if exc.kind == "too_large":
                await self._close(CloseCode.MESSAGE_TOO_LARGE, "message too large")
            else:
                await self.protocol_error(exc.reason, exc.kind)
            return None

    async def binary(self, data: bytes, version: int | None) -> AudioPacket | None:
        """The Opus packet and its v2 timestamp; `version` None means no hello yet."""
        if not await self._admit():
            return None
        if len(data) > self._config.max_binary_bytes:
            await self._close(CloseCode.MESSAGE_TOO_LARGE, "binary frame too large")
            return None
        if version is None:
            await self._close(CloseCode.PROTOCOL_ERROR, "binary before hello")
            return None
        try:
            return decode_audio(data, version)
        except ProtocolError as exc:
            await self.protocol_error(exc.reason, exc.kind)
            return None

    def binary_now(self, data: bytes, version: int | None) -> AudioPacket | None:
        """`binary` for a frame that passes without a close or an error, decided without
        awaiting; None: the frame needs `binary` (which then decides it again, the same way).
        A token is spent only for a frame taken here."""
        if version is None or len(data) > self._config.max_binary_bytes:
            return None
        try:
            packet = decode_audio(data, version)
        except ProtocolError:
            return None
        return packet if self._bucket.take() else None

    async def protocol_error(self, reason: str, kind: str) -> None:
        self.errors += 1
        logger.warning("device sent a bad frame",
                       extra={"reason": reason, "kind": kind, "count": self.errors})
        if self.errors >= MAX_PROTOCOL_ERRORS:
            await self._close(CloseCode.PROTOCOL_ERROR, "too many protocol errors")

    async def _admit(self) -> bool:
        if self._bucket.take():
            return True
        await self._close(CloseCode.FLOOD, "too many messages")
        return False
