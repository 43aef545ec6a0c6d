"""Presence writes in batches: sessions marked online at hello and offline at close.

When thousands of sockets drop at once, one DB write per session queues behind the others
in the shared thread pool; each session only waits a few seconds for its writes before it
gives up, so most devices stayed "online". Here a closing consumer hands its session id to
the offline writer of its event loop and may wait a little for it; the writer keeps every id
until a batched UPDATE (devices_mark_offline) has succeeded, on its own thread, retrying while
the database is busy or down. What a crash loses, the start-up reset and the stale sweeper
(presence.py) catch.

A reboot storm is the same in reverse: thousands of hellos within seconds, each one an
UPDATE of its own. The online writer gathers the sessions that said hello while the previous
batch was being written into one UPDATE (devices_mark_online), so the writes per second stay
few however many devices arrive. A session's online write still completes before its
offline one (the session awaits it, in order, on its persistence queue).
"""
from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable

from channels.db import database_sync_to_async

from devices.presence import devices_mark_offline, devices_mark_online
from xiaozhi_site.db_threads import kept_connections_executor

logger = logging.getLogger(__name__)

BATCH_SIZE = 500  # session ids per UPDATE (well under SQLite's bound-variable limit)
RETRY_SECONDS = 1.0

_writers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, BatchWriter]] = weakref.WeakKeyDictionary()
# One thread for every loop's writers: batches are few, and the pool's threads stay free.
_executor = kept_connections_executor("presence-writer", workers=1)


class BatchWriter:
    """One per event loop and kind; its task runs as long as the loop (the process) does."""

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


_WRITES: dict[str, Callable[..., int]] = {"offline": devices_mark_offline, "online": devices_mark_online}


def _writer(kind: str) -> BatchWriter:
    """The `kind` writer of the running event loop (created on first use)."""
    writers = _writers.setdefault(asyncio.get_running_loop(), {})
    writer = writers.get(kind)
    if writer is None:
        writer = writers[kind] = BatchWriter(kind, _WRITES[kind])
    return writer


def offline_writer() -> BatchWriter:
    return _writer("offline")


def online_writer() -> BatchWriter:
    return _writer("online")
