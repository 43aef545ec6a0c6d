"""One writer per process for the gateway's history: finished turns of every connection are
buffered and stored together, one database write per `linger` seconds.

Why batch: a write per turn costs about a millisecond of ORM work under the GIL (plus a
thread hop and a reconnect, with CONN_MAX_AGE=0), taken from the replies that run meanwhile;
at 100 clients it also queues 100 small transactions on Django's single DB thread. One
`bulk_create` per batch keeps the history seconds-fresh at a fraction of the cost.
Pure asyncio: the flush function is injected (the consumer passes the DB service).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from conversations.gateway.config import TurnRecord
from conversations.pipeline.aio import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingTurn:
    turn: TurnRecord
    client_address: str


Flush = Callable[[list[PendingTurn], list[str]], Awaitable[None]]


class HistoryWriter:
    def __init__(self, flush: Flush, *, linger: float = 0.2, limit: int = 10_000) -> None:
        self._flush_to = flush
        self.linger = linger
        self.limit = limit  # buffered turns; beyond it (database down) new ones are dropped
        self._turns: list[PendingTurn] = []
        self._ended: list[str] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0

    def add_turn(self, turn: TurnRecord, client_address: str) -> None:
        if len(self._turns) >= self.limit:
            self.dropped += 1
            log.error("gateway history buffer full, turn dropped", extra={"dropped": self.dropped})
            return
        self._turns.append(PendingTurn(turn, client_address))
        self._wake.set()

    def end_session(self, session_id: str) -> None:
        self._ended.append(session_id)
        self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._turns) + len(self._ended)

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()  # bound to the running loop
            if self.pending:
                self._wake.set()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="gateway-history")

    async def aclose(self) -> None:
        """Stop the timer and write what is buffered."""
        task, self._task = self._task, None
        await cancel_and_wait(task)
        await self.flush()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self.linger)  # let a burst of turns share one write
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        turns, self._turns = self._turns, []
        ended, self._ended = self._ended, []
        if not turns and not ended:
            return
        try:
            await self._flush_to(turns, ended)
        except Exception:
            log.exception("gateway history write failed", extra={"turns": len(turns)})
