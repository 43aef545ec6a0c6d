"""An ASGI app whose WebSockets are accepted only after `SLOW_ACCEPT_SECONDS` (default 7): a
server under load, for the test of how long daphne lets an upgrade wait
(xiaozhi_site/tests/test_upgrade_timeout.py). No Django: daphne imports it on its own."""
from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]


async def application(scope: Message, receive: Callable[[], Awaitable[Message]],
                      send: Callable[[Message], Awaitable[None]]) -> None:
    if scope["type"] != "websocket":
        return
    if (await receive())["type"] != "websocket.connect":
        return
    await asyncio.sleep(float(os.environ.get("SLOW_ACCEPT_SECONDS", "7")))
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.send", "text": "accepted"})
    while (await receive())["type"] != "websocket.disconnect":
        pass
