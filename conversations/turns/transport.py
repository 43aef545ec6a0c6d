"""The socket as a session sees it: the one transport contract of device and gateway sessions."""
from __future__ import annotations

from typing import Protocol


class Transport(Protocol):
    """Implemented by the Channels consumers (DeviceConsumer, GatewayConsumer) and by test
    recorders. Sends after close are dropped silently; `close` may be called more than once."""

    async def send_text(self, text: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...
