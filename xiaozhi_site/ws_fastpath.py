"""Two per-frame costs of autobahn (daphne's WebSocket layer) taken off the uplink (issue 17).

Unmasking. Every frame a client sends is XOR-masked with a 4-byte key (RFC 6455 §5.3). autobahn's
native masker (`autobahn.nvx`, cffi) builds a C object per frame and copies the payload in
and out of cffi buffers: six cffi calls and an import per frame, ~10-15 us for a device's
~140-byte audio frame, at ~17 frames a second per device (issue 17). Here the payload and the
repeated key are XORed as two integers (one C-level pass each way), the same bytes out.

A debug line per read. autobahn's Twisted adapter logs every chunk it receives at debug
level, and formats the line's arguments (`hltype`, `hlval`: qualified names coloured through
click) before the logger drops it: ~6 % of the event loop's time at 250 streaming devices.
`dataReceived` here hands the bytes on without it (autobahn's debug logging is never on).

`install()` swaps both; idempotent, applied by xiaozhi_site.asgi with the other daphne
patches.
"""
from __future__ import annotations

from typing import Any


class IntXorMasker:
    """autobahn's masker interface (`process`, `pointer`, `reset`) over Python integers.
    `process` may be called with a frame's payload in pieces; the key's phase follows."""

    __slots__ = ("_mask", "_ptr")

    def __init__(self, mask: bytes) -> None:
        if len(mask) != 4:
            raise ValueError("a WebSocket mask is 4 bytes")
        self._mask = bytes(mask)
        self._ptr = 0

    def pointer(self) -> int:
        return self._ptr

    def reset(self) -> None:
        self._ptr = 0

    def process(self, data: bytes) -> bytes:
        size = len(data)
        if not size:
            return b""
        phase = self._ptr & 3
        mask = self._mask[phase:] + self._mask[:phase]
        key = (mask * ((size >> 2) + 1))[:size]
        self._ptr += size
        return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(size, "little")


def create_xor_masker(mask: bytes, length: int | None = None) -> IntXorMasker:
    """autobahn's factory signature; one masker fits every length."""
    return IntXorMasker(mask)


def data_received(self: Any, data: bytes) -> None:
    """`WebSocketAdapterProtocol.dataReceived` without the debug line."""
    self._dataReceived(data)


def install() -> None:
    from autobahn.twisted.websocket import WebSocketAdapterProtocol  # noqa: PLC0415 - daphne's layer
    from autobahn.websocket import protocol  # noqa: PLC0415

    protocol.create_xor_masker = create_xor_masker  # type: ignore[assignment]
    WebSocketAdapterProtocol.dataReceived = data_received  # type: ignore[method-assign]


def installed() -> bool:
    from autobahn.twisted.websocket import WebSocketAdapterProtocol  # noqa: PLC0415
    from autobahn.websocket import protocol  # noqa: PLC0415

    reader = WebSocketAdapterProtocol.dataReceived
    return bool(protocol.create_xor_masker is create_xor_masker and reader is data_received)
