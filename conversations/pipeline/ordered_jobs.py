"""Background jobs run one after another, in submission order, off the caller's path.

The session uses it for its persistence hooks (presence online, tool list, touch, offline):
each is a DB round-trip that must not delay the next frame, yet their *order* matters — a
short session's "offline" must never overtake its "online", or the device stays online.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger(__name__)

Job = Callable[[], Awaitable[object]]


class OrderedJobs:
    """One worker task draining a bounded queue of jobs; failures are logged, not raised."""

    def __init__(self, name: str, maxsize: int = 64) -> None:
        self._name = name
        self._queue: asyncio.Queue[Job | None] = asyncio.Queue(maxsize)
        self._worker: asyncio.Task[None] | None = None
        self.dropped = 0

    def submit(self, job: Job) -> None:
        """Queue `job` (a zero-argument coroutine function); never blocks the caller."""
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name=self._name)
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            # Only happens if the DB is stuck for minutes; losing a touch beats blocking.
            self.dropped += 1
            logger.warning("background job queue full, job dropped", extra={"owner": self._name})

    async def _run(self) -> None:
        while (job := await self._queue.get()) is not None:
            try:
                await job()
            except Exception:
                logger.exception("background job failed", extra={"owner": self._name})

    async def aclose(self, timeout: float) -> None:
        """Let queued jobs finish (up to `timeout` seconds), then stop the worker."""
        worker = self._worker
        if worker is None:
            return
        try:
            self._queue.put_nowait(None)
        except asyncio.QueueFull:
            worker.cancel()
        done, _ = await asyncio.wait({worker}, timeout=timeout)
        if not done:
            logger.warning("background jobs did not finish in time", extra={"owner": self._name})
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
