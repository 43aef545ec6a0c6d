"""A key's limits over several web workers (conversations/gateway/limits.py).

The limiter against a real Redis: two limiters stand for two workers sharing it. Then end to
end: two real servers linked by the same Redis (as devices/tests/test_two_workers_e2e.py,
each on its own port, so which worker serves what is certain), and one server with two
workers sharing its port, where the kernel picks the worker.
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from conversations.gateway import consumer
from conversations.gateway.auth import KeyGrant
from conversations.gateway.keys import gateway_key_create
from conversations.gateway.limits import KeyLimiter, RedisKeyLimits
from conversations.routing import websocket_urlpatterns
from testing.fake_openai import FakeOpenAI


def grant(rpm: int = 60, connections: int = 2) -> KeyGrant:
    # A fresh prefix per grant: its own counts in Redis, whatever earlier tests left there.
    return KeyGrant(key_id=1, name="k", requests_per_minute=rpm, max_connections=connections,
                    prefix=uuid.uuid4().hex[:8])


@pytest.fixture
async def workers(redis_url: str) -> AsyncIterator[Any]:
    """`workers(n, **options)` → n limiters sharing one Redis, as n web workers would."""
    made: list[RedisKeyLimits] = []

    def make(count: int = 2, refresh_interval: float = 10.0, **options: Any) -> list[KeyLimiter]:
        limits = [RedisKeyLimits(redis_url, **options) for _ in range(count)]
        made.extend(limits)
        return [KeyLimiter(one, refresh_interval=refresh_interval) for one in limits]

    yield make
    for limits in made:
        await limits.aclose()


# -- the limiter against Redis ----------------------------------------------------------------------


@pytest.mark.integration
async def test_two_workers_see_one_count_of_a_keys_connections(workers: Any) -> None:
    first, second = workers(2)
    key = grant(connections=2)
    held = [await first.open(key), await second.open(key)]
    assert all(slot is not None and slot.shared for slot in held)
    assert await first.open(key) is None and await second.open(key) is None
    assert await first.redis.connections(key) == 2

    slot = held[0]
    assert slot is not None and slot.refresher is not None
    await first.close(slot)  # given back on one worker, taken on the other
    assert slot.refresher is None and await second.redis.connections(key) == 1
    again = await second.open(key)
    assert again is not None and await first.open(key) is None
    for one in (held[1], again):
        assert one is not None
        await second.close(one)
    assert await first.redis.connections(key) == 0


@pytest.mark.integration
async def test_a_dead_workers_connections_come_back_after_the_slot_ttl(workers: Any) -> None:
    dying, living = workers(2, slot_ttl=0.6, refresh_interval=0.15)
    key = grant(connections=2)
    slots = [await dying.open(key), await living.open(key)]
    await asyncio.sleep(1.2)  # twice the TTL: refreshed, both still count
    assert await living.open(key) is None and await living.redis.connections(key) == 2

    assert slots[0] is not None and slots[0].refresher is not None
    slots[0].refresher.cancel()  # SIGKILL: no close, no more refreshes
    await asyncio.sleep(0.8)
    assert await living.redis.connections(key) == 1  # the living worker's slot is still there
    taken = await living.open(key)
    assert taken is not None and await living.open(key) is None
    for slot in (slots[1], taken):
        assert slot is not None
        await living.close(slot)


@pytest.mark.integration
async def test_two_workers_share_one_bucket_refilled_at_the_keys_rate(workers: Any) -> None:
    now = [1000.0]
    first, second = workers(2, clock=lambda: now[0])
    key = grant(rpm=3)
    assert [await first.request(key), await second.request(key), await first.request(key)] == [0.0, 0.0, 0.0]
    assert await second.request(key) == pytest.approx(20.0)  # one request every 60/3 s
    now[0] += 19.0
    assert await first.request(key) == pytest.approx(1.0)
    now[0] += 1.0
    assert await second.request(key) == 0.0 and await first.request(key) > 0
    now[0] += 3600.0  # a long pause refills the bucket, no further
    assert [await first.request(key) for _ in range(4)][-1] == pytest.approx(20.0)
    assert await first.request(grant(rpm=3)) == 0.0  # another key has its own bucket


@pytest.mark.integration
async def test_the_bucket_follows_redis_time(workers: Any) -> None:
    first, second = workers(2)
    key = grant(rpm=60)
    taken = await asyncio.gather(*(limiter.request(key) for limiter in (first, second) for _ in range(30)))
    assert taken == [0.0] * 60
    wait = await second.request(key)
    assert 0.0 < wait <= 1.0
    await asyncio.sleep(wait + 0.05)
    assert await first.request(key) == 0.0


@pytest.mark.integration
async def test_concurrent_takes_never_exceed_the_capacity(workers: Any) -> None:
    # Time stands still: nothing refills. 200 calls at once open up to 200 connections: on a
    # loaded machine some took longer than the default 1 s, and every worker then counted in
    # its own process (the fallback, tested elsewhere), granting 125 (CI, session 31).
    limiters = workers(8, clock=lambda: 5000.0, timeout=10.0)
    key = grant(rpm=50, connections=5)
    waits = await asyncio.gather(*(limiters[n % 8].request(key) for n in range(200)))
    assert waits.count(0.0) == 50
    slots = await asyncio.gather(*(limiters[n % 8].open(key) for n in range(40)))
    assert sum(slot is not None for slot in slots) == 5
    for n, slot in enumerate(slots):
        if slot is not None:
            await limiters[n % 8].close(slot)


async def test_without_redis_a_key_is_counted_in_this_process_and_it_is_said_once(caplog: Any) -> None:
    limiter = KeyLimiter(RedisKeyLimits("redis://127.0.0.1:1/0", timeout=0.5))  # nothing listens there
    key = grant(rpm=2, connections=1)
    with caplog.at_level(logging.INFO, logger="conversations.gateway.limits"):
        slot = await limiter.open(key)
        assert slot is not None and not slot.shared and slot.refresher is None
        assert await limiter.open(key) is None  # the key's cap holds in this process
        assert [await limiter.request(key) for _ in range(3)][:2] == [0.0, 0.0]
        await limiter.close(slot)
        assert limiter.local.connections(key.key_id) == 0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "Redis unreachable" in warnings[0].getMessage()
    await limiter.redis.aclose()  # type: ignore[union-attr]


# -- the consumer: a slot's refresh belongs to its connection ----------------------------------------


@pytest.fixture
def redis_limits(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[KeyLimiter]:
    limiter = KeyLimiter(RedisKeyLimits(redis_url))
    monkeypatch.setattr(consumer.PROCESS, "keys", limiter)
    yield limiter


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
async def test_a_connection_refreshes_its_slot_until_it_disconnects(
    redis_limits: KeyLimiter, settings: Any
) -> None:
    with FakeOpenAI() as fake:
        settings.LLM_BASE_URL = fake.base_url
        key, secret = await sync_to_async(gateway_key_create)(name="kiosk", max_connections=1)
        communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), "/llm/v1/",
                                             headers=[(b"authorization", f"Bearer {secret}".encode())])
        assert (await communicator.connect())[0]
        assert json.loads(await communicator.receive_from(5))["status"] == "connected"
        refreshers = [t for t in asyncio.all_tasks() if t.get_name().startswith("gateway-key-slot-")]
        assert len(refreshers) == 1
        grant_ = KeyGrant(key.pk, key.name, key.requests_per_minute, key.max_connections, prefix=key.prefix)
        assert redis_limits.redis is not None and await redis_limits.redis.connections(grant_) == 1
        await communicator.disconnect()
        await asyncio.sleep(0)
        assert refreshers[0].cancelled() and await redis_limits.redis.connections(grant_) == 0
    await redis_limits.redis.aclose()


# -- end to end: two workers, one Redis ---------------------------------------------------------------


async def _hello(url: str) -> tuple[ClientConnection, dict[str, Any]]:
    ws = await connect(url, open_timeout=20)
    return ws, json.loads(await asyncio.wait_for(ws.recv(), 20))


async def _refused(url: str) -> tuple[dict[str, Any], int]:
    ws, first = await _hello(url)
    with pytest.raises(ConnectionClosed) as closed:
        await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None
    return first, closed.value.rcvd.code


async def _ask(ws: ClientConnection, text: str) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "text_input", "text": text}, ensure_ascii=False))
    while (message := json.loads(await asyncio.wait_for(ws.recv(), 20)))["type"] not in ("llm_response", "error"):
        pass
    return message


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.mark.integration
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_a_keys_limits_hold_across_two_workers(asgi_server_factory: Any, redis_url: str,
                                                      fake: FakeOpenAI) -> None:
    """Before: each worker counted alone, so a key got twice its connections and its rate
    (docs/performance.md, "Several workers")."""
    env = {"REDIS_URL": redis_url, "LLM_BASE_URL": fake.base_url}
    one, other = asgi_server_factory(**env), asgi_server_factory(**env)
    secret = await sync_to_async(lambda: gateway_key_create(name="app", max_connections=2,
                                                            requests_per_minute=2)[1])()
    on_one, on_other = f"{one.ws_url}/llm/v1/?token={secret}", f"{other.ws_url}/llm/v1/?token={secret}"

    held = [await _hello(on_one), await _hello(on_other)]
    assert [first["status"] for _, first in held] == ["connected", "connected"]
    for url in (on_one, on_other):  # the key's 3rd connection, on either worker
        first, code = await _refused(url)
        assert (first["code"], first["message"], code) == ("RATE_LIMITED", "Too many connections for this key", 1013)

    assert (await _ask(held[0][0], "一"))["type"] == "llm_response"
    assert (await _ask(held[1][0], "二"))["type"] == "llm_response"
    for ws, _ in held:  # the bucket is empty on both workers
        refused = await _ask(ws, "三")
        assert (refused["code"], refused["message"]) == ("RATE_LIMITED", "Rate limit exceeded")
        assert "2 requests per minute" in refused["details"]
    assert len(fake.chat_requests) == 2

    await held[0][0].close()  # a slot given back on one worker is free on the other
    ws, first = await _hello_when_free(on_other)
    assert first["status"] == "connected"
    for ws_ in (ws, held[1][0]):
        await ws_.close()


async def _hello_when_free(url: str, timeout: float = 5.0) -> tuple[ClientConnection, dict[str, Any]]:
    """The close reaches the server a moment after the client's close returns."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        ws, first = await _hello(url)
        if first.get("type") != "error" or asyncio.get_running_loop().time() > deadline:
            return ws, first
        await ws.close()
        await asyncio.sleep(0.1)


@pytest.mark.integration
@pytest.mark.e2e
@pytest.mark.django_db(transaction=True)
async def test_a_keys_limits_hold_when_two_workers_share_the_port(asgi_server_factory: Any, redis_url: str,
                                                                   fake: FakeOpenAI) -> None:
    """XIAOZHI_WORKERS=2 as under `make run`: the kernel spreads the 8 connections over both
    workers (all on one worker: a chance of 1 in 128), which count together."""
    server = asgi_server_factory(REDIS_URL=redis_url, LLM_BASE_URL=fake.base_url, XIAOZHI_WORKERS="2")
    secret = await sync_to_async(lambda: gateway_key_create(name="app", max_connections=8,
                                                            requests_per_minute=8)[1])()
    url = f"{server.ws_url}/llm/v1/?token={secret}"
    held = [await _hello(url) for _ in range(8)]
    assert {first["status"] for _, first in held} == {"connected"}
    first, code = await _refused(url)
    assert (first["code"], code) == ("RATE_LIMITED", 1013)

    answers = [await _ask(ws, f"问题 {n}") for n in range(2) for ws, _ in held]
    assert [a["type"] for a in answers[:8]] == ["llm_response"] * 8
    assert {(a["code"], a["message"]) for a in answers[8:]} == {("RATE_LIMITED", "Rate limit exceeded")}
    assert len(fake.chat_requests) == 8
    for ws, _ in held:
        await ws.close()
