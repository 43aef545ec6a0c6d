"""The request path's cache client is one per process (xiaozhi_site/shared_cache.py).

Under ASGI Django's `cache` is context-local and every request starts from a context of its
own, so each OTA check-in built its own RedisCache, connection pool and Redis connection for
its rate-limit count: most of a check-in's cost in the reboot storm (docs/performance.md,
session 26)."""
from __future__ import annotations

import asyncio
import contextvars
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis.connection

from simulator.ota import Identity, request_headers, system_info
from xiaozhi_site.db_threads import close_kept_connections, kept_connections_executor
from xiaozhi_site.device_http import SyncRequestHandler
from xiaozhi_site.shared_cache import shared_cache
from xiaozhi_site.tests.test_device_http import call

CHECK_INS = 30


@pytest.fixture
def redis_connects(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every Redis connection this process opens from now on."""
    opened: list[object] = []
    connect = redis.connection.Connection._connect  # the socket's creation, however it is reached

    def counting(self: redis.connection.Connection) -> Any:
        opened.append(self)
        return connect(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", counting)
    return opened


@pytest.fixture
def handler() -> Iterator[SyncRequestHandler]:
    yield SyncRequestHandler(kept_connections_executor("test-shared-cache", 2))
    close_kept_connections()


def check_in(n: int) -> tuple[dict[str, str], bytes]:
    identity = Identity(mac=f"02:00:00:00:{n // 256:02x}:{n % 256:02x}",
                        client_id=f"7b94d69a-1c2d-4e5f-8a9b-0c1d2e3f{n:04x}", board="bread-compact-wifi",
                        firmware_version="2.4.2", language="zh-CN", serial_number=None)
    body = json.dumps(system_info(identity)).encode()
    return {**request_headers(identity), "Host": "testserver", "Content-Length": str(len(body))}, body


@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_many_check_ins_open_a_handful_of_redis_connections(
    settings: Any, redis_connects: list[object], handler: SyncRequestHandler,
) -> None:
    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")
    shared_cache().clear()  # fresh rate-limit counts (this worker's own Redis database)
    redis_connects.clear()

    async def storm() -> None:
        for n in range(CHECK_INS):  # each request in a task of its own, as daphne runs them
            status, _, content = await asyncio.create_task(call(handler, "POST", "/xiaozhi/ota/", *check_in(n)))
            assert status == 200, content

    contextvars.Context().run(asyncio.run, storm())  # from an empty context, as daphne's requests start
    assert len(redis_connects) <= 2, f"{len(redis_connects)} Redis connections for {CHECK_INS} check-ins"


def test_the_shared_cache_is_one_client_for_every_context_and_thread() -> None:
    async def in_a_task() -> int:
        return id(shared_cache())

    async def many() -> set[int]:
        ids = set(await asyncio.gather(*(asyncio.create_task(in_a_task()) for _ in range(5))))
        ids |= set(await asyncio.gather(*(asyncio.to_thread(lambda: id(shared_cache())) for _ in range(5))))
        return ids

    assert contextvars.Context().run(asyncio.run, many()) == {id(shared_cache())}
