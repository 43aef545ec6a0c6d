"""Costs of autobahn and daphne (the WebSocket layer) taken off the device path (issue 17).

Unmasking. Every frame a client sends is XOR-masked with a 4-byte key (RFC 6455 §5.3).
autobahn's native masker (`autobahn.nvx`, cffi) builds a C object per frame and copies the payload in
and out of cffi buffers: six cffi calls and an import per frame, ~10-15 us for a device's
~140-byte audio frame, at ~17 frames a second per device (issue 17). Here the payload and the
repeated key are XORed as two integers (one C-level pass each way), the same bytes out.

A debug line per read, and the parser for the common frame. autobahn's Twisted adapter logs
every chunk it receives at debug level, and formats the line's arguments (`hltype`,
`hlval`: qualified names coloured through click) before the logger drops it: ~6 % of the
event loop's time at 250 streaming devices.
`dataReceived` here hands the bytes on without it (autobahn's debug logging is never on),
and a read holding exactly one whole masked binary message goes to the application at once
(`data_received` lists what it checks first).

A pretty-printed debug line per connection. autobahn's `_connectionMade` pretty-prints its
~40 options for a debug line the logger then drops: ~0.2 ms of the event loop per device
connect, ~2 % of the server's time in a reboot storm (docs/performance.md, P10). Its module's
`pformat` now defers the work to when a line is really formatted.

Highlighted names and values for debug lines. autobahn formats each debug line's arguments
with `hltype` and `hlval` (a qualified name, a value as text, coloured through click) before
the logger drops the line: ~9 us for every frame sent (`sendData`), ~7 us for every lost
connection (the reason is a Twisted Failure whose text is a brief traceback; each refused
device's close, under overload). Both modules' names now defer the work to when a line is
really formatted (`LazyText`).

A direct path for audio frames. The frame above, once unmasked, went to the application
through daphne's `onMessage`: a message dict on the ASGI queue, the consumer's task woken,
Channels' dispatch, two coroutines down to the session (~20 us of the event loop per frame on
the Zen 3 machine). Each WebSocket scope now carries a `BinaryTap` (the ASGI extension
`BINARY_TAP`); a consumer that sets its `sink` gets such frames by a plain call as they are
read, while nothing is queued ahead of them, and may decline one (False: it takes the queue).

A refusal without an application. A device refused past capacity (1013) went through a whole
consumer first: an application instance and its task, a channel name, Channels' dispatch, the
accept and close messages, the disconnect (docs/performance.md, session 32). A gate
(`set_gate`; xiaozhi_site.asgi sets conversations.admission's) sees each WebSocket scope
first; when it answers (code, reason), the handshake is accepted and closed with them at once,
and daphne gets a queue nobody reads instead of an application. Measured: the server's CPU
per refused device 4.0-4.4 -> 3.4-3.8 ms (the rest is the TCP accept, HTTP parsing and the
handshake).

A refusal without a handshake. What a refused device still cost (~2.2 ms of the server's CPU
on session 42's machine: Twisted's HTTP parsing, daphne's request and autobahn's handshake,
the close handshake) fell on the interpreter lock of the devices streaming, and at twice the
capacity arriving the refusals came just as the last places filled (docs/performance.md,
session 42). `upgrade_refusal` reads the connection's first read itself: a whole WebSocket
upgrade request (GET, HTTP/1.1, `Upgrade: websocket`, version 13, a 16-byte key) that the
gate refuses gets its 101 and the close frame in one write, from xiaozhi_site/daphne_limits.py,
which half-closes and drops what the client still sends. Anything else, and a request split
over reads, takes daphne's path and its gate as before. Measured: the server's CPU per refused
device arriving 1.97-2.10 -> 1.48-1.66 ms (the rest is the TCP accept, the write and the close).

`install()` swaps them all; idempotent, applied by xiaozhi_site.asgi with the other daphne
patches.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import pprint
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import unquote

from websockets.utils import accept_key

from xiaozhi_site.daphne_close import reason_bytes

logger = logging.getLogger(__name__)

BINARY_TAP = "xiaozhi.binary_tap"  # the scope extension's name (ASGI `scope["extensions"]`)


class BinaryTap:
    """One WebSocket's direct path for binary frames: `sink(payload)` returns True when it
    took the frame, False to have it queued as usual. None until the application sets it."""

    __slots__ = ("sink",)

    def __init__(self) -> None:
        self.sink: Callable[[bytes], bool] | None = None


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


class LazyText:
    """A text-making function (autobahn.util's `hltype`, `hlval`) that returns a `Later`:
    autobahn passes them only as arguments of its debug lines."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[..., str]) -> None:
        self.make = make

    def __call__(self, *args: Any, **kwargs: Any) -> Later:
        return Later(self.make, args, kwargs)


class Later:
    """`make(*args, **kwargs)` when (and only if) it is turned into text."""

    __slots__ = ("args", "kwargs", "make")

    def __init__(self, make: Callable[..., str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.make, self.args, self.kwargs = make, args, kwargs

    def __str__(self) -> str:
        return self.make(*self.args, **self.kwargs)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


class LazyPformat:
    """`pprint.pformat(value)` when (and only if) it is turned into text: autobahn.websocket.
    protocol's `pformat`, only ever an argument of a debug line there, except in
    `Timings.__str__`, which install() gives a real one."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __str__(self) -> str:
        return pprint.pformat(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def timings_text(self: Any) -> str:
    """`Timings.__str__` as autobahn writes it, with the real pformat."""
    return pprint.pformat(self._timings)


OPEN = 3  # autobahn's WebSocketProtocol.STATE_OPEN (install() checks)


def data_received(self: Any, data: bytes) -> None:
    """`WebSocketAdapterProtocol.dataReceived` without the debug line; a read that is exactly
    one whole masked binary message (a device's audio frame) goes straight to `_onMessage`.

    autobahn's parser takes ~15 Python calls per frame (header checks, frame and message
    begin/data/end hooks, the buffers of a fragmented message) for that same outcome. The
    short cut reads only what it can verify: an open connection with nothing buffered and no
    message under way, no compression, frame logging, timings or auto-ping timeout, a FIN
    binary frame without reserved bits, masked, minimal length encoding, non-empty and
    within the connection's frame and message limits (daphne_limits), ending exactly at the
    end of the read. Anything else (text, control frames, fragments, partial or coalesced
    reads, oversized frames) takes autobahn's own path, which also applies the same counters."""
    if _single_binary_message(self, data):
        return
    self._dataReceived(data)


def _single_binary_message(self: Any, data: bytes) -> bool:
    size = len(data)
    if (size < 7 or data[0] != 0x82 or not data[1] & 0x80 or self.state != OPEN or self.data
            or self.current_frame is not None or self.inside_message or self.failedByMe
            or self._perMessageCompress is not None or self.logOctets or self.logFrames
            or self.trackedTimings or self.autoPingTimeoutCall is not None):
        return False
    length = data[1] & 0x7F
    header = 6
    if length == 126:
        length, header = int.from_bytes(data[2:4], "big"), 8
        if length < 126:
            return False  # not minimal: autobahn reports the violation
    elif length == 127:
        return False
    if length == 0 or size != header + length:
        return False
    for limit in (self.maxFramePayloadSize, self.maxMessagePayloadSize):
        if 0 < limit < length:
            return False  # autobahn refuses it (1009)
    payload = IntXorMasker(data[header - 4 : header]).process(data[header:])
    stats = self.trafficStats
    stats.incomingOctetsWireLevel += size
    stats.incomingOctetsWebSocketLevel += length
    stats.incomingOctetsAppLevel += length
    stats.incomingWebSocketFrames += 1
    stats.incomingWebSocketMessages += 1
    if not _tapped(self, payload):
        self._onMessage(payload, True)
    return True


def _tapped(self: Any, payload: bytes) -> bool:
    """The frame handed to the tap's sink, if there is one and nothing is queued ahead."""
    tap = getattr(self, "binary_tap", None)  # daphne's connections (install); autobahn's others have none
    sink = tap.sink if tap is not None else None
    if sink is None or self.muted or not self.application_queue.empty():
        return False
    self.last_ping = time.time()  # daphne's sign of life (its onMessage sets it): no pings while streaming
    try:
        return sink(payload)
    except Exception:  # the application's bug: the frame takes the queue and the usual handling
        logger.exception("binary tap failed")
        return False


Gate = Callable[[Mapping[str, Any]], "tuple[int, str] | None"]
_gate: Gate | None = None


def set_gate(gate: Gate | None) -> None:
    """Who may refuse a WebSocket before an application is made for it: the gate answers a
    scope with (close code, reason), or None to let it through. It may read only the scope's
    type and path (`upgrade_refusal` asks with those alone)."""
    global _gate
    _gate = gate


def upgrade_refusal(data: bytes) -> bytes | None:
    """The answer to a connection's first read when it is a whole WebSocket upgrade request
    the gate refuses right now: the handshake accepted and a close frame with the gate's code
    and reason. None for anything else, which daphne reads as usual (its gate asks again)."""
    if _gate is None or not data.startswith(b"GET /"):
        return None
    request = _upgrade_request(data)
    if request is None:
        return None
    path, key = request
    refusal = _gate({"type": "websocket", "path": path})
    if refusal is None:
        return None
    code, reason = refusal
    return _switching_protocols(key) + _close_frame(code, reason)


def _upgrade_request(data: bytes) -> tuple[str, bytes] | None:
    """(path, Sec-WebSocket-Key) of a complete, valid upgrade request, or None."""
    head, blank, _rest = data.partition(b"\r\n\r\n")
    if not blank:
        return None  # the headers go on in a later read
    request_line, *lines = head.split(b"\r\n")
    parts = request_line.split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        return None
    headers: dict[bytes, bytes] = {}
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon:
            return None
        headers[name.strip().lower()] = value.strip()
    connection = {token.strip() for token in headers.get(b"connection", b"").lower().split(b",")}
    if (headers.get(b"upgrade", b"").lower() != b"websocket" or b"upgrade" not in connection
            or headers.get(b"sec-websocket-version") != b"13"):
        return None
    key = headers.get(b"sec-websocket-key", b"")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            return None
        path = unquote(parts[1].split(b"?", 1)[0].decode("ascii"), errors="strict")  # daphne's scope path
    except (binascii.Error, UnicodeDecodeError):
        return None
    return path, key


def _switching_protocols(key: bytes) -> bytes:
    return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept_key(key.decode("ascii")).encode("ascii") + b"\r\n\r\n")


def _close_frame(code: int, reason: str) -> bytes:
    """An unmasked close frame, as a server sends it (RFC 6455 §5.5.1)."""
    text = reason_bytes(reason)
    return bytes((0x88, 2 + len(text))) + struct.pack("!H", code) + text


def refuse_without_application(server: Any, protocol: Any, code: int, reason: str) -> asyncio.Queue[Any]:
    """Accept the handshake and close it with `code` and `reason`, as the application would
    have, without making one. daphne puts its connect (and later disconnect) message on the
    queue returned, which nobody reads; with no application instance it forgets the
    connection once it is closed."""

    def close() -> None:  # after onConnect, which sets up the handshake this completes
        details = server.connections.get(protocol)
        if details is None or details.get("disconnected"):
            return  # the client left first
        protocol.handle_reply({"type": "websocket.accept"})
        protocol.handle_reply({"type": "websocket.close", "code": code, "reason": reason})

    asyncio.get_running_loop().call_soon(close)
    return asyncio.Queue()


def create_application(original: Callable[..., Any]) -> Callable[..., Any]:
    """daphne's `Server.create_application`, asking the gate first and giving each WebSocket
    scope its `BinaryTap`."""

    def create(server: Any, protocol: Any, scope: dict[str, Any]) -> Any:
        if scope.get("type") == "websocket":
            refusal = _gate(scope) if _gate is not None else None
            if refusal is not None:
                return refuse_without_application(server, protocol, *refusal)
            protocol.binary_tap = BinaryTap()
            scope["extensions"] = {**(scope.get("extensions") or {}), BINARY_TAP: protocol.binary_tap}
        return original(server, protocol, scope)

    create.tapping = True  # type: ignore[attr-defined]
    return create


def install() -> None:
    from autobahn.twisted import websocket  # noqa: PLC0415 - daphne's layer
    from autobahn.websocket import protocol  # noqa: PLC0415

    if protocol.WebSocketProtocol.STATE_OPEN != OPEN:
        raise RuntimeError("autobahn's connection states changed: review ws_fastpath")
    from daphne.server import Server  # noqa: PLC0415
    from daphne.ws_protocol import WebSocketProtocol  # noqa: PLC0415

    WebSocketProtocol.binary_tap = None  # until create_application gives the connection one
    if not getattr(Server.create_application, "tapping", False):
        Server.create_application = create_application(Server.create_application)  # type: ignore[method-assign]
    protocol.create_xor_masker = create_xor_masker  # type: ignore[assignment]
    websocket.WebSocketAdapterProtocol.dataReceived = data_received  # type: ignore[method-assign]
    protocol.Timings.__str__ = timings_text  # type: ignore[method-assign]
    protocol.pformat = LazyPformat  # type: ignore[assignment]  # a lazy value, formatted as text later
    for module in (protocol, websocket):  # module globals, so every debug line in them
        for name in ("hltype", "hlval"):
            if not isinstance(getattr(module, name), LazyText):
                setattr(module, name, LazyText(getattr(module, name)))


def installed() -> bool:
    from autobahn.twisted import websocket  # noqa: PLC0415
    from autobahn.websocket import protocol  # noqa: PLC0415

    from daphne.server import Server  # noqa: PLC0415

    reader = websocket.WebSocketAdapterProtocol.dataReceived
    return bool(protocol.create_xor_masker is create_xor_masker and reader is data_received
                and getattr(Server.create_application, "tapping", False)
                and protocol.pformat is LazyPformat
                and all(isinstance(getattr(module, name), LazyText)
                        for module in (protocol, websocket) for name in ("hltype", "hlval")))
