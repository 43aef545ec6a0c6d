"""Small asyncio helpers: every task has an owner, and owners cancel what they own."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel tasks and wait until they are really finished (their finally blocks ran)."""
    pending = [task for task in tasks if task is not None and not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


class TaskSet:
    """Tracks fire-and-forget tasks so they are never garbage-collected mid-flight, their
    errors are logged, and `aclose()` cancels whatever is still running."""

    def __init__(self, name: str = "") -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def create(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        if self._closed:
            coro.close()
            raise RuntimeError("TaskSet is closed")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception(),
                      extra={"task": task.get_name(), "owner": self._name})

    def __len__(self) -> int:
        return len(self._tasks)

    async def aclose(self) -> None:
        self._closed = True
        await cancel_and_wait(*self._tasks)
