"""GET /healthz: the state of the database, the channel layer and the Celery broker."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest, JsonResponse

CHECK_TIMEOUT_SECONDS = 3  # an int: kombu types its connect timeout as int


def _check_database() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        connection.close()


async def _check_channel_layer() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured")
    # Every concrete layer (in-memory, Redis) takes a prefix; the base class declares none.
    channel = await layer.new_channel("healthz.")  # type: ignore[call-arg]
    await layer.send(channel, {"type": "healthz.ping"})
    message = await layer.receive(channel)
    if message.get("type") != "healthz.ping":
        raise RuntimeError("channel layer returned an unexpected message")


def _check_celery_broker() -> None:
    from xiaozhi_site.celery import app

    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=CHECK_TIMEOUT_SECONDS)


async def _timed(check: Callable[[], Awaitable[None]]) -> dict:
    started = time.perf_counter()
    try:
        await asyncio.wait_for(check(), CHECK_TIMEOUT_SECONDS)
    except Exception as exc:  # noqa: BLE001 - any failure means "down", reported by type only
        return {"ok": False, "error": type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"[:200]}
    return {"ok": True, "ms": round((time.perf_counter() - started) * 1000, 1)}


async def healthz(request: HttpRequest) -> JsonResponse:
    results = await asyncio.gather(
        _timed(sync_to_async(_check_database, thread_sensitive=False)),
        _timed(_check_channel_layer),
        _timed(sync_to_async(_check_celery_broker, thread_sensitive=False)),
    )
    components = dict(zip(("database", "channel_layer", "celery_broker"), results, strict=True))
    down = [name for name, result in components.items() if not result["ok"]]
    body = {"status": "ok" if not down else "unavailable", "down": down, "components": components}
    return JsonResponse(body, status=503 if down else 200)
