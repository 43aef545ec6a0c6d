"""Let daphne close WebSockets with the code *and reason* the application chose.

Daphne turns an ASGI `websocket.close` into autobahn's `sendClose(code)`: it drops the
`reason` (ASGI spec 2.3), and autobahn's `sendClose` only accepts 1000 or 3000–4999, so a
server-full 1013, a message-too-big 1009 or an idle 1001 fail inside daphne and the client
sees 1011. Devices and gateway clients are told why they were closed, so `install()` wraps
daphne's reply handling: registered codes go out through autobahn's lower-level
`sendCloseFrame`, the others through `sendClose`, both with the reason. Idempotent; applied
by xiaozhi_site.asgi.
"""
from __future__ import annotations

from typing import Any

# RFC 6455 §7.4.1: registered codes a server may put in a close frame itself.
REGISTERED = frozenset({1001, 1008, 1009, 1011, 1012, 1013})
MAX_REASON_BYTES = 123  # a control frame carries 125 bytes, 2 of them the code


def reason_bytes(reason: str | None) -> bytes:
    """A close reason as UTF-8 cut to a close frame's room, on a character boundary."""
    data = (reason or "").encode("utf-8")[:MAX_REASON_BYTES]
    return data.decode("utf-8", errors="ignore").encode("utf-8")  # never cut a character in half


def install() -> bool:
    try:
        from daphne.ws_protocol import WebSocketProtocol
    except ImportError:
        return False
    if getattr(WebSocketProtocol.handle_reply, "_with_reason", False):
        return True
    original = WebSocketProtocol.handle_reply

    def handle_reply(self: Any, message: dict) -> None:
        if message.get("type") != "websocket.close" or self.state == self.STATE_CONNECTING:
            return original(self, message)
        code = message.get("code") or 1000
        reason = reason_bytes(message.get("reason"))
        if code in REGISTERED:
            self.sendCloseFrame(code=code, reasonUtf8=reason, isReply=False)
        else:
            self.sendClose(code=code, reason=reason.decode("utf-8") or None)
        return None

    handle_reply._with_reason = True  # type: ignore[attr-defined]
    WebSocketProtocol.handle_reply = handle_reply
    return True
