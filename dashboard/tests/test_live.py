"""Live session counts: per process registry, publisher, and the sum over processes."""
from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from conversations.pipeline.states import SessionState
from dashboard import live
from dashboard.live import LiveRegistry, MemoryStore, ProcessCounts, RedisStore, live_sessions


class Consumer:
    """What the registry reads of a consumer: its `session` (a device session has a `state`)."""

    def __init__(self, session: Any) -> None:
        self.session = session


def device(state: SessionState | None) -> Consumer:
    return Consumer(None if state is None else SimpleNamespace(state=state))


def gateway(connected: bool) -> Consumer:
    return Consumer(object() if connected else None)


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> MemoryStore:
    store = MemoryStore()
    monkeypatch.setattr(live, "_store", store)
    monkeypatch.setattr(live, "PUBLISH_INTERVAL", 0.02)
    return store


def test_a_process_counts_its_sessions_by_state_and_its_gateway_clients() -> None:
    registry = LiveRegistry("test")
    consumers = [device(SessionState.LISTENING), device(SessionState.LISTENING), device(SessionState.SPEAKING),
                 device(SessionState.CLOSING), device(None)]
    gateways = [gateway(True), gateway(False)]
    for consumer in consumers:
        registry._devices.add(consumer)  # tracking outside an event loop only registers
    for consumer in gateways:
        registry.track_gateway(consumer)
    counts = registry.counts()
    assert counts.sessions == {"listening": 2, "speaking": 1} and counts.gateway == 1


async def test_the_publisher_runs_while_the_process_holds_sessions(memory: MemoryStore) -> None:
    registry = LiveRegistry("process-a")
    consumer = device(SessionState.CONNECTING)
    registry.track_device(consumer)
    await asyncio.sleep(0)  # the publisher's first round
    assert [c.sessions for c in memory.collect()] == [{"connecting": 1}]
    consumer.session.state = SessionState.THINKING
    await asyncio.sleep(0.1)
    assert [c.sessions for c in memory.collect()] == [{"thinking": 1}]
    consumer.session.state = SessionState.CLOSING  # the socket closed
    await asyncio.wait_for(registry._task, timeout=2)  # type: ignore[arg-type]
    assert memory.collect() == []


async def test_a_consumer_arriving_after_the_publisher_stopped_starts_it_again(memory: MemoryStore) -> None:
    registry = LiveRegistry("process-b")
    gone, connected = gateway(False), gateway(True)
    registry.track_gateway(gone)  # already gone: nothing to publish
    await asyncio.wait_for(registry._task, timeout=2)  # type: ignore[arg-type]
    registry.track_gateway(connected)
    await asyncio.sleep(0)
    assert [c.gateway for c in memory.collect()] == [1]
    connected.session = None
    await asyncio.wait_for(registry._task, timeout=2)  # type: ignore[arg-type]


def test_the_dashboard_sums_every_process(memory: MemoryStore) -> None:
    asyncio.run(memory.publish("a", ProcessCounts(sessions=Counter(listening=2, idle=1), gateway=3)))
    asyncio.run(memory.publish("b", ProcessCounts(sessions=Counter(listening=1, speaking=4), gateway=0)))
    total = live_sessions()
    assert total.available and total.processes == 2 and total.gateway == 3
    assert total.sessions == {"connecting": 0, "idle": 1, "listening": 3, "thinking": 0, "speaking": 4}
    assert total.device_sockets == 8


def test_an_unreachable_store_makes_the_figures_unavailable_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "_store", RedisStore("redis://127.0.0.1:1/0"))
    total = live_sessions()
    assert not total.available and total.device_sockets == 0


async def test_a_failing_store_never_stops_the_publisher(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "_store", RedisStore("redis://127.0.0.1:1/0"))
    monkeypatch.setattr(live, "PUBLISH_INTERVAL", 0.02)
    registry = LiveRegistry("process-c")
    consumer = device(SessionState.IDLE)
    registry.track_device(consumer)
    await asyncio.sleep(0.1)
    assert registry._failing and not registry._task.done()  # type: ignore[union-attr]
    consumer.session.state = SessionState.CLOSING
    await asyncio.wait_for(registry._task, timeout=5)  # type: ignore[arg-type]


@pytest.fixture
def redis_store(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[RedisStore]:
    import redis

    monkeypatch.setattr(live, "_KEY_PREFIX", f"test:{uuid.uuid4().hex}:")
    monkeypatch.setattr(live, "_PROCESSES_KEY", live._KEY_PREFIX + "processes")
    store = RedisStore(redis_url)
    monkeypatch.setattr(live, "_store", store)
    yield store
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(live._KEY_PREFIX + "*"):
        client.delete(key)


@pytest.mark.integration
async def test_processes_publishing_to_redis_are_summed_and_dead_ones_dropped(redis_store: RedisStore) -> None:
    import redis

    await redis_store.publish("a", ProcessCounts(sessions=Counter(listening=2), gateway=1))
    await redis_store.publish("b", ProcessCounts(sessions=Counter(speaking=1), gateway=0))
    total = await asyncio.to_thread(live_sessions)
    assert total.processes == 2 and total.sessions["listening"] == 2 and total.sessions["speaking"] == 1
    redis.Redis.from_url(redis_store.url).delete(live._KEY_PREFIX + "b")  # b's key expired: it died
    total = await asyncio.to_thread(live_sessions)
    assert total.processes == 1 and total.sessions["speaking"] == 0
    assert redis.Redis.from_url(redis_store.url).smembers(live._PROCESSES_KEY) == {b"a"}
    await redis_store.withdraw("a")
    assert (await asyncio.to_thread(live_sessions)).processes == 0


@pytest.mark.integration
async def test_a_process_key_expires_by_itself_when_the_process_stops_publishing(
        redis_store: RedisStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live, "STALE_AFTER", 0.2)
    await redis_store.publish("gone", ProcessCounts(sessions=Counter(idle=1)))
    assert (await asyncio.to_thread(live_sessions)).processes == 1
    await asyncio.sleep(0.4)
    assert (await asyncio.to_thread(live_sessions)).processes == 0
