"""Live figures across every ASGI process: sessions by state, gateway clients, devices online.

Each process knows only its own sockets. Device and gateway consumers add themselves to this
process's `REGISTRY` (one line in each consumer's connect); while it has any, a small task on
the process's event loop counts them every `PUBLISH_INTERVAL` seconds and publishes the counts
under its own process id, with a `STALE_AFTER` expiry:
- with REDIS_URL: in Redis (one key per process with a TTL, plus a set of process ids), so
  every web process sees every other one;
- without: in this process's memory (without Redis there is only one ASGI process: the
  in-memory channel layer cannot span processes).
The dashboard sums what is published. Devices online come from `Device.is_online`, which
every process writes when a device connects (its claim) and disconnects. A page polling every
second therefore shows a device arriving or leaving within about two seconds, whichever process
holds its socket.

Sessions are read, never changed: a device session's `state` (conversations/pipeline), a
gateway consumer's `session`. Nothing here is on a device's realtime path: a Redis failure
only makes the dashboard show the figures as unavailable.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from django.conf import settings

logger = logging.getLogger(__name__)

PUBLISH_INTERVAL = 1.0
STALE_AFTER = 5.0
SESSION_STATES = ("connecting", "idle", "listening", "thinking", "speaking")
_KEY_PREFIX = "xiaozhi:dashboard:live:"
_PROCESSES_KEY = _KEY_PREFIX + "processes"
_REDIS_TIMEOUT = 1.0


@dataclass
class ProcessCounts:
    """What one process holds right now."""

    sessions: Counter[str] = field(default_factory=Counter)  # device sessions by state
    gateway: int = 0

    @property
    def empty(self) -> bool:
        return not any(self.sessions.values()) and self.gateway == 0

    def to_json(self) -> str:
        return json.dumps({"sessions": dict(self.sessions), "gateway": self.gateway})

    @classmethod
    def from_json(cls, text: str | bytes) -> ProcessCounts:
        data = json.loads(text)
        sessions = Counter({str(k): int(v) for k, v in dict(data.get("sessions", {})).items()})
        return cls(sessions=sessions, gateway=int(data.get("gateway", 0)))


# -- where processes publish ---------------------------------------------------------------------


class LiveStore(Protocol):
    async def publish(self, process_id: str, counts: ProcessCounts) -> None: ...
    async def withdraw(self, process_id: str) -> None: ...
    def collect(self) -> list[ProcessCounts]: ...


class MemoryStore:
    """One process, no Redis: a dict with expiry times."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, ProcessCounts]] = {}

    async def publish(self, process_id: str, counts: ProcessCounts) -> None:
        self._entries[process_id] = (time.monotonic() + STALE_AFTER, counts)

    async def withdraw(self, process_id: str) -> None:
        self._entries.pop(process_id, None)

    def collect(self) -> list[ProcessCounts]:
        now = time.monotonic()
        return [counts for expires, counts in list(self._entries.values()) if expires > now]


class RedisStore:
    """Several processes: a key per process that expires on its own if the process dies (Redis
    keeps the time, so clocks of different machines never matter) and a set naming them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._async: Any = None
        self._async_loop: asyncio.AbstractEventLoop | None = None
        self._sync: Any = None

    def _async_client(self) -> Any:
        import redis.asyncio

        loop = asyncio.get_running_loop()
        if self._async is None or self._async_loop is not loop:  # a client belongs to one loop
            self._async = redis.asyncio.Redis.from_url(self.url, socket_timeout=_REDIS_TIMEOUT,
                                                       socket_connect_timeout=_REDIS_TIMEOUT)
            self._async_loop = loop
        return self._async

    async def publish(self, process_id: str, counts: ProcessCounts) -> None:
        client = self._async_client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.set(_KEY_PREFIX + process_id, counts.to_json(), px=int(STALE_AFTER * 1000))
            pipe.sadd(_PROCESSES_KEY, process_id)
            await pipe.execute()

    async def withdraw(self, process_id: str) -> None:
        client = self._async_client()
        async with client.pipeline(transaction=False) as pipe:
            pipe.delete(_KEY_PREFIX + process_id)
            pipe.srem(_PROCESSES_KEY, process_id)
            await pipe.execute()

    def collect(self) -> list[ProcessCounts]:
        import redis

        if self._sync is None:
            self._sync = redis.Redis.from_url(self.url, socket_timeout=_REDIS_TIMEOUT,
                                              socket_connect_timeout=_REDIS_TIMEOUT)
        ids = sorted(member.decode() for member in self._sync.smembers(_PROCESSES_KEY))
        if not ids:
            return []
        values = self._sync.mget([_KEY_PREFIX + process_id for process_id in ids])
        gone = [process_id for process_id, value in zip(ids, values, strict=True) if value is None]
        if gone:  # expired: the process died or went quiet; it re-adds itself when it publishes
            self._sync.srem(_PROCESSES_KEY, *gone)
        return [ProcessCounts.from_json(value) for value in values if value is not None]


_store: LiveStore | None = None


def store() -> LiveStore:
    global _store
    if _store is None:
        _store = RedisStore(settings.REDIS_URL) if settings.REDIS_URL else MemoryStore()
    return _store


# -- this process's sockets --------------------------------------------------------------------


def _device_state(consumer: Any) -> str | None:
    session = getattr(consumer, "session", None)
    state = getattr(session, "state", None)
    value = getattr(state, "value", state)
    return value if isinstance(value, str) and value in SESSION_STATES else None  # closing: gone


class LiveRegistry:
    """The live consumers of this process, and the task that publishes their counts."""

    def __init__(self, process_id: str | None = None) -> None:
        self.process_id = process_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._devices: weakref.WeakSet[Any] = weakref.WeakSet()
        self._gateways: weakref.WeakSet[Any] = weakref.WeakSet()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def track_device(self, consumer: Any) -> None:
        """Called by DeviceConsumer once its session exists; weak, so nothing to undo."""
        self._devices.add(consumer)
        self._ensure_publisher()

    def track_gateway(self, consumer: Any) -> None:
        """Called by GatewayConsumer once its session exists."""
        self._gateways.add(consumer)
        self._ensure_publisher()

    def counts(self) -> ProcessCounts:
        states = Counter(state for state in map(_device_state, list(self._devices)) if state)
        gateway = sum(1 for consumer in list(self._gateways) if getattr(consumer, "session", None) is not None)
        return ProcessCounts(sessions=states, gateway=gateway)

    def _ensure_publisher(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        self._task = loop.create_task(self._publish_while_busy(), name="dashboard-live-publisher")

    async def _publish_while_busy(self) -> None:
        """Publish every second; once the process holds nothing, withdraw and stop (the next
        consumer to arrive starts it again). Cancelled with its loop at shutdown: what it
        published then expires by itself after STALE_AFTER."""
        live = store()
        while True:
            counts = self.counts()
            if counts.empty:
                await self._safely(live.withdraw(self.process_id))
                return
            await self._safely(live.publish(self.process_id, counts))
            await asyncio.sleep(PUBLISH_INTERVAL)

    async def _safely(self, call: Any) -> None:
        try:
            await call
        except Exception:  # Redis down: the dashboard shows "unavailable", devices never notice
            if not self._failing:
                logger.warning("dashboard live figures could not be published", exc_info=True)
            self._failing = True
        else:
            self._failing = False


REGISTRY = LiveRegistry()


# -- what the dashboard shows -------------------------------------------------------------------


@dataclass
class LiveSessions:
    available: bool
    processes: int = 0
    sessions: dict[str, int] = field(default_factory=dict)
    gateway: int = 0

    @property
    def device_sockets(self) -> int:
        return sum(self.sessions.values())


def live_sessions() -> LiveSessions:
    """The sum over every process that published in the last few seconds."""
    try:
        published = store().collect()
    except Exception:
        logger.warning("dashboard live figures could not be read", exc_info=True)
        return LiveSessions(available=False, sessions=dict.fromkeys(SESSION_STATES, 0))
    total: Counter[str] = Counter()
    for counts in published:
        total.update(counts.sessions)
    return LiveSessions(available=True, processes=len(published),
                        sessions={state: total.get(state, 0) for state in SESSION_STATES},
                        gateway=sum(counts.gateway for counts in published))
