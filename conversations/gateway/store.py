"""Gateway sessions that outlive a connection: resume by session_id, expiry, cleanup.

Decision: the store is an in-process dict swept by an in-process asyncio task, not Django's
cache and not a Celery beat job. Why:

- A session is live Python state (history, LLM options, the built-in tools' language and
  role-play state) read and written on every turn. A dict costs microseconds; the cache
  would add a (de)serialisation and, with Redis, a network round trip to each reply, whose
  whole budget is 3 ms (P6).
- Celery beat runs in another process and cannot see this memory, so it could not sweep it;
  a beat job only makes sense for a shared store, and a shared store's TTL (Redis) would
  expire entries by itself anyway.
- The product runs one daphne process (`make run`), so "any process can resume" is the
  same as "this process can resume". Running several web processes needs sticky routing by
  session_id, or a cache-backed implementation of this class's small surface.

The sweeper runs every CLOUD_SESSION_CLEANUP_INTERVAL seconds while at least one gateway
connection is open (the consumer starts and stops it), so an idle server has no timer.
Lookups also check expiry, so a session is never resumed late even between sweeps.

Memory is bounded twice, because a session outlives its connection by up to an hour: at most
`max_detached` sessions without a connection are kept (CLOUD_MAX_DETACHED_SESSIONS; past it
the one detached longest ago is dropped), and a session's history keeps at most
`max_history_bytes` of text (CLOUD_SESSION_HISTORY_BYTES; the oldest exchanges go first).
Without them 40 clients that sent three 900 KiB messages each left 111 MB behind for an hour
(bench/gateway_session_memory.py; 0.3 MB with the caps).
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from conversations.gateway.protocol import ErrorCode, GatewayError
from conversations.pipeline.aio import cancel_and_wait
from tools.builtin import SessionToolState

log = logging.getLogger(__name__)

_TOMBSTONES = 1024  # remembered expired ids, to say "expired" instead of "not found"
DEFAULT_MAX_DETACHED = 1000
DEFAULT_MAX_HISTORY_BYTES = 32 * 1024

ExpiredCallback = Callable[[list[str]], Awaitable[None]]


@dataclass
class ChatOptions:
    """What `configure` changes (seed §4.2); kept with the session so a resume keeps it."""

    temperature: float = 0.7
    max_tokens: int = 2048
    enable_context: bool = False


@dataclass
class SessionRecord:
    session_id: str
    options: ChatOptions
    tool_state: SessionToolState
    history: list[dict[str, str]] = field(default_factory=list)
    turns: int = 0  # finished turns, numbering the stored history across reconnects
    last_active: float = field(default_factory=time.monotonic)
    # The connection holding the session, and how to tell it that another one took over.
    owner: object | None = None
    evict: Callable[[], None] | None = None
    max_history_bytes: int = DEFAULT_MAX_HISTORY_BYTES  # set by the store

    def add_exchange(self, user_text: str, reply: str, limit: int) -> None:
        """Append one user/assistant pair and keep at most `limit` messages and at most
        `max_history_bytes` of UTF-8 text (an exchange larger than that is not kept)."""
        self.history.append({"role": "user", "content": user_text})
        self.history.append({"role": "assistant", "content": reply})
        del self.history[: max(0, len(self.history) - limit)]
        sizes = [_utf8_size(message["content"]) for message in self.history]
        total = sum(sizes)
        drop = 0
        while total > self.max_history_bytes and drop < len(sizes):
            total -= sizes[drop]
            drop += 1
        del self.history[:drop]
        # An odd limit could leave an orphan answer first; the model needs its question.
        while self.history and self.history[0]["role"] != "user":
            del self.history[0]


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class SessionStore:
    """Sessions by id, with expiry after `timeout` seconds without a connection or a turn."""

    def __init__(
        self,
        *,
        timeout: float,
        cleanup_interval: float,
        max_sessions: int = 10_000,
        max_detached: int = DEFAULT_MAX_DETACHED,
        max_history_bytes: int = DEFAULT_MAX_HISTORY_BYTES,
        on_expired: ExpiredCallback | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = timeout
        self.cleanup_interval = cleanup_interval
        self.max_sessions = max_sessions
        self.max_detached = max_detached
        self.max_history_bytes = max_history_bytes
        self.on_expired = on_expired
        self._clock = clock
        self._sessions: dict[str, SessionRecord] = {}
        self._detached: OrderedDict[str, None] = OrderedDict()  # let go of, oldest first
        self._dropped: list[str] = []  # dropped to make room; the next sweep reports them
        self._expired: OrderedDict[str, None] = OrderedDict()
        self._sweeper: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    @property
    def detached(self) -> int:
        """Sessions kept without a connection."""
        return len(self._detached)

    # -- sessions ---------------------------------------------------------------------------

    def create(self, options: ChatOptions, tool_state: SessionToolState) -> SessionRecord:
        self._make_room()
        record = SessionRecord(
            uuid.uuid4().hex, options, tool_state, last_active=self._clock(), max_history_bytes=self.max_history_bytes
        )
        self._sessions[record.session_id] = record
        return record

    def get(self, session_id: str) -> SessionRecord:
        """The live session, or GatewayError(SESSION_ERROR) saying not found or expired."""
        record = self._sessions.get(session_id)
        if record is not None and self._is_expired(record, self._clock()):
            self._expire([record.session_id])
            record = None
        if record is not None:
            return record
        if session_id in self._expired:
            raise GatewayError(ErrorCode.SESSION_ERROR, "Session expired", f"session {session_id[:64]} expired")
        raise GatewayError(ErrorCode.SESSION_ERROR, "Session not found", f"no session {session_id[:64]}")

    def attach(self, record: SessionRecord, owner: object, evict: Callable[[], None]) -> None:
        """Give the session to a connection; a previous holder is told to let go."""
        previous, previous_evict = record.owner, record.evict
        record.owner, record.evict = owner, evict
        record.last_active = self._clock()
        self._detached.pop(record.session_id, None)
        if previous is not None and previous is not owner and previous_evict is not None:
            previous_evict()

    def detach(self, record: SessionRecord, owner: object) -> None:
        """The connection let go; the expiry clock starts now."""
        if record.owner is owner and record.session_id in self._sessions:
            record.owner = record.evict = None
            record.last_active = self._clock()
            self._detached[record.session_id] = None
            self._drop_detached_over(self.max_detached)

    def touch(self, record: SessionRecord) -> None:
        record.last_active = self._clock()

    def remove(self, session_id: str) -> None:
        """end_session: the session is gone and cannot be resumed."""
        self._sessions.pop(session_id, None)
        self._detached.pop(session_id, None)
        self._remember_expired(session_id)

    # -- expiry -----------------------------------------------------------------------------

    def _is_expired(self, record: SessionRecord, now: float) -> bool:
        # A held session never expires: its connection has its own idle timeout.
        return record.owner is None and now - record.last_active > self.timeout

    def collect_expired(self) -> list[str]:
        """Drop every expired session now; returns their ids."""
        now = self._clock()
        expired = [sid for sid, record in self._sessions.items() if self._is_expired(record, now)]
        self._expire(expired)
        return expired

    def _expire(self, session_ids: list[str]) -> None:
        for session_id in session_ids:
            self._sessions.pop(session_id, None)
            self._detached.pop(session_id, None)
            self._remember_expired(session_id)

    def _drop(self, session_ids: list[str]) -> None:
        """Expire sessions early to bound memory; the next sweep reports them."""
        self._expire(session_ids)
        self._dropped.extend(session_ids)
        del self._dropped[: max(0, len(self._dropped) - _TOMBSTONES)]

    def _drop_detached_over(self, limit: int) -> None:
        excess = len(self._detached) - limit
        if excess > 0:
            log.info("gateway detached sessions over the cap, dropping the oldest", extra={"count": excess})
            self._drop([session_id for session_id, _ in zip(self._detached, range(excess), strict=False)])

    def _remember_expired(self, session_id: str) -> None:
        self._expired[session_id] = None
        while len(self._expired) > _TOMBSTONES:
            self._expired.popitem(last=False)

    def _make_room(self) -> None:
        """Past `max_sessions`, drop expired sessions, then the longest-idle detached ones."""
        if len(self._sessions) < self.max_sessions:
            return
        self.collect_expired()
        detached = sorted(
            (r for r in self._sessions.values() if r.owner is None), key=lambda r: r.last_active
        )
        excess = len(self._sessions) - self.max_sessions + 1
        if excess > 0:
            log.warning("gateway session store full, dropping idle sessions", extra={"count": excess})
            self._drop([r.session_id for r in detached[:excess]])

    # -- sweeper ----------------------------------------------------------------------------

    @property
    def sweeping(self) -> bool:
        return self._sweeper is not None and not self._sweeper.done()

    def start_sweeper(self) -> None:
        if not self.sweeping:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever(), name="gateway-sweeper")

    async def stop_sweeper(self) -> None:
        sweeper, self._sweeper = self._sweeper, None
        await cancel_and_wait(sweeper)

    async def sweep(self) -> list[str]:
        """One cleanup pass; the callback (closing stored conversations) sees the ids, with
        those dropped early to bound memory since the last pass."""
        expired = self.collect_expired()
        expired += self._dropped
        self._dropped = []
        if expired:
            log.info("gateway sessions expired", extra={"count": len(expired)})
            if self.on_expired is not None:
                await self.on_expired(expired)
        return expired

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.cleanup_interval)
            try:
                await self.sweep()
            except Exception:
                log.exception("gateway session sweep failed")
