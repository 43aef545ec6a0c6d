"""Limits daphne applies before a request reaches the application (docs/security.md).

Daphne (Twisted underneath) reads a whole HTTP request, body included, into memory or a
temporary file before the ASGI application sees its first byte, so nothing in Django or an
ASGI middleware can refuse a 1 GB upload in time, and Twisted's idle timeout restarts with
every byte, so headers trickled one byte at a time hold a connection forever. `install()`
puts the limits where the bytes arrive:

- HTTP: a request's headers must be complete within `header_timeout` of its first byte (or
  of the previous response on a kept-alive connection), its body within `body_timeout`;
  else 408 (or a silent close when nothing was sent). A body larger than its route's limit
  gets 413 as soon as that is known: at once from Content-Length, or when a chunked body
  passes the limit. After a refusal the server half-closes, drops what still arrives for
  `linger` seconds so the client can read the answer, then aborts the socket.
- A first read answered at once (`set_first_read_answer`): a device refused past capacity
  gets its 1013 without daphne's parsing (xiaozhi_site/ws_fastpath.py), then the same
  half-close and linger.
- WebSocket: each route accepts frames and messages up to its own size (`websocket_routes`,
  twice the application's limit, so the application still answers an oversized message
  itself: the gateway's INVALID_MESSAGE then 1009, a device's 4413), and anything larger is
  refused by autobahn with a 1009 close frame instead of a dropped TCP connection (1006).

Idempotent; applied by xiaozhi_site.asgi, so every way of starting daphne gets it. It patches
daphne's and Twisted's classes by name (daphne 4.2, Twisted 26):
xiaozhi_site/tests/test_daphne_limits.py runs the real server against each limit.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_WEBSOCKET_BYTES = 1024 * 1024  # daphne's own default, for routes not listed


@dataclass(frozen=True)
class EdgeLimits:
    header_timeout: float
    body_timeout: float
    body_bytes: int  # routes not listed in body_routes
    body_routes: tuple[tuple[str, int], ...] = ()  # (path prefix, bytes), first match wins
    websocket_routes: tuple[tuple[str, int], ...] = ()  # (exact path without trailing "/", bytes)
    websocket_bytes: int = DEFAULT_WEBSOCKET_BYTES
    linger: float = 2.0

    def body_limit(self, target: bytes) -> int:
        """The limit for a raw request target (`/path?query`, or absolute-form). An encoded
        path that hides a listed prefix only gets the default, which is the strictest."""
        path = target.split(b"?", 1)[0]
        if b"://" in path:
            path = b"/" + path.split(b"://", 1)[1].partition(b"/")[2]
        text = path.decode("latin-1")
        return next((limit for prefix, limit in self.body_routes if text.startswith(prefix)), self.body_bytes)

    def websocket_limit(self, path: str) -> int:
        key = path.rstrip("/")
        return next((limit for route, limit in self.websocket_routes if route == key), self.websocket_bytes)


def limits_from_settings() -> EdgeLimits:
    from django.conf import settings

    from devices.vision import MULTIPART_SLACK_BYTES

    gateway = 2 * settings.CLOUD_MAX_MESSAGE_BYTES
    device = 2 * max(settings.XIAOZHI_MAX_TEXT_BYTES, settings.XIAOZHI_MAX_BINARY_BYTES)
    return EdgeLimits(
        header_timeout=settings.XIAOZHI_HTTP_HEADER_TIMEOUT_SECONDS,
        body_timeout=settings.XIAOZHI_HTTP_BODY_TIMEOUT_SECONDS,
        body_bytes=settings.XIAOZHI_HTTP_MAX_BODY_BYTES,
        body_routes=(
            ("/admin/", settings.XIAOZHI_HTTP_ADMIN_MAX_BODY_BYTES),
            ("/mcp/vision/explain", settings.XIAOZHI_VISION_MAX_BYTES + MULTIPART_SLACK_BYTES),
        ),
        websocket_routes=(("/llm/v1", gateway), ("", gateway), ("/xiaozhi/v1", device)),
    )


def _response(status: int, reason: str, code: str, message: str) -> bytes:
    body = json.dumps({"error": code, "message": message}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    return head.encode() + body


_limits: EdgeLimits | None = None
# A connection's first read -> the whole answer, after which the connection is closed as a
# refusal; None: read as usual (xiaozhi_site/ws_fastpath.py `upgrade_refusal`).
FirstReadAnswer = Callable[[bytes], "bytes | None"]
_first_read_answer: FirstReadAnswer | None = None


def set_first_read_answer(answer: FirstReadAnswer | None) -> None:
    """Who may answer a connection's first read before daphne parses it."""
    global _first_read_answer
    _first_read_answer = answer


def install(limits: EdgeLimits) -> bool:
    """Apply `limits` to every connection daphne accepts from now on."""
    global _limits
    try:
        from daphne import http_protocol, ws_protocol
    except ImportError:
        return False
    _limits = limits
    if getattr(http_protocol.HTTPFactory, "_xiaozhi_limits", False):
        return True
    _install_http(http_protocol)
    _install_websocket(ws_protocol.WebSocketProtocol)
    http_protocol.HTTPFactory._xiaozhi_limits = True
    return True


def _install_http(http_protocol: Any) -> None:
    # Defined here, not at module level: Twisted is imported only inside daphne, after daphne
    # has installed its asyncio reactor.
    from twisted.internet.protocol import connectionDone
    from twisted.python.failure import Failure
    from twisted.web import http

    class GuardedRequest(http_protocol.WebRequest):  # type: ignore[name-defined,misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            # Django reads the body from the ASGI messages; Twisted's own parse of form posts
            # into `request.args` (the email package for every POST's Content-Type, a whole
            # multipart body in memory) is never used by daphne: ~4 % of an OTA check's CPU.
            kwargs.setdefault("parsePOSTFormSubmission", False)
            super().__init__(*args, **kwargs)

        def handleContentChunk(self, data: bytes) -> None:
            if self.channel is not None and self.channel.body_received(len(data)):
                super().handleContentChunk(data)

    class GuardedChannel(http.HTTPChannel):  # type: ignore[misc]
        """Twisted's HTTP/1.1 channel with header and body deadlines and body limits."""

        def __init__(self) -> None:
            super().__init__()
            self._deadline: Any = None
            self._refused = False
            self._body_limit = 0
            self._body_seen = 0
            self._first_read = True

        def connectionMade(self) -> None:
            super().connectionMade()
            self._arm(_current().header_timeout, self._headers_too_slow)

        def dataReceived(self, data: bytes) -> None:
            if self._refused:  # once refused, what still arrives is dropped
                return
            if self._first_read:
                self._first_read = False
                answer = _first_read_answer(data) if _first_read_answer is not None else None
                if answer is not None:
                    self._refuse(answer)
                    return
            super().dataReceived(data)

        def rawDataReceived(self, data: bytes) -> None:
            if not self._refused:
                super().rawDataReceived(data)

        def allHeadersReceived(self) -> None:
            self._disarm()
            limits = _current()
            # Twisted stores the raw target (bytes) through a local it first used for a Request.
            target: bytes = self._path  # type: ignore[assignment]
            limit = limits.body_limit(target)
            if self.length is not None and self.length > limit:
                self._refuse_too_large(limit)
                return
            self._body_limit, self._body_seen = limit, 0
            super().allHeadersReceived()
            if self.length != 0:
                self._arm(limits.body_timeout, self._body_too_slow)

        def body_received(self, size: int) -> bool:
            """Count decoded body bytes (chunked bodies have no length up front)."""
            if self._refused:
                return False
            self._body_seen += size
            if self._body_seen > self._body_limit:
                self._refuse_too_large(self._body_limit)
                return False
            return True

        def allContentReceived(self) -> None:
            if self._refused:  # the end of a refused chunked body arrived in the same read
                return
            self._disarm()
            super().allContentReceived()

        def requestDone(self, request: Any) -> None:
            if self.persistent:
                # Armed before the buffered next request (if any) is parsed by super().
                self._arm(_current().header_timeout, self._headers_too_slow)
            super().requestDone(request)

        def connectionLost(self, reason: Failure = connectionDone) -> None:
            self._disarm()
            super().connectionLost(reason)

        # -- deadlines and refusals ---------------------------------------------------

        def _arm(self, seconds: float, action: Any) -> None:
            self._disarm()
            self._deadline = self.callLater(seconds, action)

        def _disarm(self) -> None:
            if self._deadline is not None and self._deadline.active():
                self._deadline.cancel()
            self._deadline = None

        def _headers_too_slow(self) -> None:
            self._deadline = None
            started = bool(self.requests) or bool(getattr(self, "_buffer", b""))
            response = _response(408, "Request Timeout", "request_timeout",
                                  "The request headers did not arrive in time.")  # fmt: skip
            self._refuse(response if started else None)  # an idle kept-alive socket just closes

        def _body_too_slow(self) -> None:
            self._deadline = None
            self._refuse(_response(408, "Request Timeout", "request_timeout", "The body did not arrive in time."))

        def _refuse_too_large(self, limit: int) -> None:
            message = f"The body must be at most {limit} bytes."
            self._refuse(_response(413, "Payload Too Large", "body_too_large", message))

        def _refuse(self, response: bytes | None) -> None:
            if self._refused or self.transport is None:
                return
            self._refused = True
            if response:
                # zope.interface methods (ITransport) are declared without self: mypy needs the
                # mypy-zope plugin to call them, which is not worth its strict mypy pin.
                self.transport.write(response)  # type: ignore[call-arg, misc]
            half_close = getattr(self.transport, "loseWriteConnection", None)
            if half_close is not None:
                half_close()
            else:
                self.transport.loseConnection()  # type: ignore[misc]  # ITransport, as above
            self._arm(_current().linger, self.transport.abortConnection)

    def guarded_channel(factory: Any) -> Any:
        return http._GenericHTTPChannelProtocol(GuardedChannel())

    original_build = http_protocol.HTTPFactory.buildProtocol

    def build_protocol(self: Any, addr: Any) -> Any:
        protocol = original_build(self, addr)  # daphne sets its WebRequest here
        if protocol is not None:
            protocol.requestFactory = GuardedRequest
        return protocol

    http_protocol.HTTPFactory.protocol = guarded_channel
    http_protocol.HTTPFactory.buildProtocol = build_protocol


def _install_websocket(protocol_class: Any) -> None:
    original = protocol_class.onConnect

    def on_connect(self: Any, request: Any) -> Any:
        limit = _current().websocket_limit(request.path)
        self.maxMessagePayloadSize = self.maxFramePayloadSize = limit
        self.failByDrop = False  # over the limit: a 1009 close frame, not a dropped socket
        return original(self, request)

    protocol_class.onConnect = on_connect


def _current() -> EdgeLimits:
    assert _limits is not None, "daphne_limits.install() sets the limits first"
    return _limits
