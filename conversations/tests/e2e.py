"""Helpers shared by the end-to-end tests that drive a real server subprocess."""
from __future__ import annotations

import asyncio
import time

from channels.db import database_sync_to_async

from devices.models import Device


async def session_recorded_closed(session_id: str, timeout: float = 10.0) -> None:
    """Wait until the server wrote its last row for a device session: presence offline,
    written after the session's history (its last turns and the conversation's end).

    The server outlives the test; its disconnect writes must not race the table flush
    that ends each transactional test (PostgreSQL would deadlock TRUNCATE against them).
    """
    if not session_id:
        return  # no hello answered: the server never writes for such a socket
    deadline = time.monotonic() + timeout
    offline = Device.objects.filter(session_id=session_id, is_online=False)
    while not await database_sync_to_async(offline.exists)():
        if time.monotonic() > deadline:
            raise AssertionError("the server did not record the end of the session")
        await asyncio.sleep(0.05)
