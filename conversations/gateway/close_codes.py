"""Let daphne close WebSockets with the registered codes the seed and RFC 6455 use.

Daphne turns an ASGI `websocket.close` into autobahn's `sendClose(code)`, and autobahn only
accepts 1000 or 3000–4999 there. The gateway needs 1013 "Try Again Later" (seed §11.1, server
full), 1009 "Message Too Big" and 1001 "Going Away" (idle), which are registered codes an
endpoint may send; with the stock check the close fails inside daphne and the client sees
1011 instead. `allow_registered_close_codes()` wraps daphne's `serverClose` so those codes go
out through autobahn's lower-level `sendCloseFrame`, and every other code takes the original
path unchanged. Idempotent; a no-op when daphne is not installed.
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# RFC 6455 §7.4.1 and the IANA registry: codes a server may put in a close frame itself.
REGISTERED = frozenset({1001, 1008, 1009, 1011, 1012, 1013})


def allow_registered_close_codes() -> bool:
    """Patch daphne once; True when the patch is (already) in place."""
    try:
        from daphne.ws_protocol import WebSocketProtocol
    except ImportError:
        return False
    if getattr(WebSocketProtocol.serverClose, "_registered_codes", False):
        return True
    original = WebSocketProtocol.serverClose

    def server_close(self: Any, code: int | None = None) -> None:
        if code in REGISTERED:
            self.sendCloseFrame(code=code, isReply=False)
        else:
            original(self, code=code)

    server_close._registered_codes = True  # type: ignore[attr-defined]
    WebSocketProtocol.serverClose = server_close
    log.debug("daphne may now close with registered codes")
    return True
