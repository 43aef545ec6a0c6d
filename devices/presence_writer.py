"""Presence writes in batches: sessions marked offline when their sockets close.

When thousands of sockets drop at once, one DB write per session queues behind the others
in the shared thread pool; each session only waits a few seconds for its writes before it
gives up, so most devices stayed "online". Here a closing consumer hands its session id to
the offline writer of its event loop and may wait a little for it; the writer keeps every id
until a batched UPDATE (devices_mark_offline) has succeeded, on its own thread, retrying while
the database is busy or down. What a crash loses, the start-up reset and the stale sweeper
(presence.py) catch.

(Online needs no writer of its own: the connection's claim, one UPDATE per connect, marks
the device online; devices/presence.py.)
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable

from channels.db import database_sync_to_async

from devices.presence import devices_mark_offline
from xiaozhi_site.db_threads import kept_connections_executor

logger = logging.getLogger(__name__)

BATCH_SIZE = 500  # session ids per UPDATE (well under SQLite's bound-variable limit)
RETRY_SECONDS = 1.0

_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, BatchWriter] = weakref.WeakKeyDictionary()
# One thread for every loop's writer: batches are few, and the pool's threads stay free.
_executor = kept_connections_executor("presence-writer", workers=1)


class BatchWriter:
    """One per event loop; its task runs as long as the loop (the process) does."""

    def __init__(self, name: str, write: Callable[..., int]) -> None:
        self.name = name
        self._pending: dict[str, list[asyncio.Future[None]]] = {}
        self._wakeup = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"presence {name} writer")
        self._write = database_sync_to_async(write, thread_sensitive=False, executor=_executor)

    def submit(self, session_id: str) -> asyncio.Future[None]:
        """Queue `session_id`; the future resolves once its row is written (never fails)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.setdefault(session_id, []).append(done)
        self._wakeup.set()
        return done

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                await self._write_batch(list(self._pending)[:BATCH_SIZE])

    async def _write_batch(self, session_ids: list[str]) -> None:
        try:
            await self._write(session_ids=session_ids)
        except Exception as exc:
            # Kept in _pending: the next round writes them again.
            logger.warning("presence write failed, retrying",
                           extra={"writer": self.name, "sessions": len(session_ids), "error": repr(exc)})
            await asyncio.sleep(RETRY_SECONDS)
            return
        for session_id in session_ids:
            for done in self._pending.pop(session_id, ()):
                if not done.done():
                    done.set_result(None)


def offline_writer() -> BatchWriter:
    """The running event loop's offline writer (created on first use)."""
    loop = asyncio.get_running_loop()
    writer = _writers.get(loop)
    if writer is None:
        writer = _writers[loop] = BatchWriter("offline", devices_mark_offline)
    return writer
