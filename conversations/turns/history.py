"""The one writer of turn history per process: finished turns of every connection (device or
gateway) are buffered and stored together, one database write per `linger` seconds.

Why batch: a write per turn costs about a millisecond of ORM work under the GIL (plus a
thread hop), taken from the replies that run meanwhile; at 100 clients it also queues 100
small transactions. One write per batch keeps the history seconds-fresh at a fraction of
the cost, and nothing on a reply path ever waits for the database.

Why retry: a write can fail for a moment (SQLite busy past its timeout, a dropped database
connection). The batch is tried again after `retry_delays`; what still fails is logged and
dropped, so a database that is down for good costs memory up to `limit` turns, never more.
Turns that the database refuses for what they contain are the save function's business: it
stores the rest of the batch row by row (conversations/services.py).

Turn audio rides along with its turn (a device turn's Opus packets, ~100 KB a minute) and
goes to the audio writer once the row is stored (conversations/services.py). Only
`audio_limit` buffered turns keep theirs: a database that is down must not pile up audio.

A conversation row is created with its first turn, so connections that never talk leave no
row. Ending a conversation goes through the writer too, queued behind its last turns.

The worker task runs only while something is buffered, on the loop that buffered it, so an
idle process has no timer and tests on fresh event loops need no set-up.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from conversations.turns.record import TurnRecord

log = logging.getLogger(__name__)

RETRY_DELAYS = (0.5, 2.0)


@dataclass(frozen=True)
class ConversationKey:
    """Which conversation a turn belongs to, and what its row is created with."""

    session_id: str
    source: str  # Conversation.SOURCE_DEVICE | SOURCE_GATEWAY
    device_id: int | None = None
    persona_id: int | None = None
    client_address: str = ""


@dataclass(frozen=True)
class PendingTurn:
    conversation: ConversationKey
    turn: TurnRecord


Save = Callable[[list[PendingTurn], list[ConversationKey]], Awaitable[None]]


class HistoryWriter:
    def __init__(
        self, save: Save, *, linger: float = 0.2, limit: int = 10_000, audio_limit: int = 500,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
    ) -> None:
        self._save = save
        self.linger = linger
        self.limit = limit  # buffered turns; beyond it (database down) new ones are dropped
        self.audio_limit = audio_limit  # buffered turns that keep their audio; beyond it, text only
        self._with_audio = 0
        self.audio_dropped = 0
        self.retry_delays = retry_delays
        self._turns: list[PendingTurn] = []
        self._ended: list[ConversationKey] = []
        self._task: asyncio.Task[None] | None = None
        self._lock: asyncio.Lock | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dropped = 0

    @property
    def pending(self) -> int:
        return len(self._turns) + len(self._ended)

    def add_turn(self, conversation: ConversationKey, turn: TurnRecord) -> None:
        """Buffer a finished turn; returns at once."""
        if len(self._turns) >= self.limit:
            self.dropped += 1
            log.error("history buffer full, turn dropped", extra={"dropped": self.dropped})
            return
        if turn.audio is not None:
            if self._with_audio >= self.audio_limit:
                turn.audio = None
                self.audio_dropped += 1
                log.warning("history buffer holds too much audio, turn audio dropped",
                            extra={"audio_dropped": self.audio_dropped})
            else:
                self._with_audio += 1
        self._turns.append(PendingTurn(conversation, turn))
        self._wake()

    def end_conversation(self, conversation: ConversationKey) -> None:
        """Mark the conversation ended once its buffered turns are stored (a no-op for a
        conversation that never had a turn)."""
        self._ended.append(conversation)
        self._wake()

    async def flush(self) -> None:
        """Store everything buffered now (waits for a write in progress first)."""
        async with self._get_lock():
            turns, self._turns = self._turns, []
            ended, self._ended = self._ended, []
            self._with_audio = 0
            if turns or ended:
                await self._save_with_retries(turns, ended)

    async def aclose(self) -> None:
        """Write what is buffered and stop the worker."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.flush()

    # -- worker ---------------------------------------------------------------------------------

    def _wake(self) -> None:
        self._bind_loop()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="history-writer")

    def _bind_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (tests): tasks and locks start afresh
            self._loop, self._task, self._lock = loop, None, None

    def _get_lock(self) -> asyncio.Lock:
        self._bind_loop()
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _run(self) -> None:
        while self.pending:
            await asyncio.sleep(self.linger)  # let a burst of turns share one write
            # Shielded: cancelling the worker (aclose) must not lose a batch mid-write.
            await asyncio.shield(self.flush())

    async def _save_with_retries(self, turns: list[PendingTurn], ended: list[ConversationKey]) -> None:
        for attempt, delay in enumerate((*self.retry_delays, None)):
            try:
                await self._save(turns, ended)
                return
            except Exception:
                if delay is None:
                    log.exception("history write failed, turns dropped",
                                  extra={"turns": len(turns), "ended": len(ended), "attempts": attempt + 1})
                    return
                log.warning("history write failed, retrying", exc_info=True,
                            extra={"turns": len(turns), "attempt": attempt + 1})
                await asyncio.sleep(delay)
