"""Live figures across server processes: a device talking to one daphne process shows on the
dashboard served by another one (PostgreSQL + Redis: the integration tier)."""
from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.conf import settings
from django.test import Client

from conversations.tests.e2e import session_recorded_closed
from simulator.device import SimulatedDevice
from devices.tests.factories import BoundDeviceFactory

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _session_cookie(user: Any) -> str:
    client = Client()
    client.force_login(user)
    return f"{settings.SESSION_COOKIE_NAME}={client.cookies[settings.SESSION_COOKIE_NAME].value}"


def _now_json(base_url: str, cookie: str) -> dict[str, Any]:
    request = urllib.request.Request(f"{base_url}/dashboard/now.json", headers={"Cookie": cookie})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


async def _until(base_url: str, cookie: str, check: Any, what: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        data = await asyncio.to_thread(_now_json, base_url, cookie)
        if check(data):
            return data
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: last figures {data}")
        await asyncio.sleep(0.2)


async def test_a_device_on_one_process_shows_on_the_dashboard_of_another(
        asgi_server_factory: Any, staff_user: Any, redis_url: str) -> None:
    env = {"XIAOZHI_WS_AUTH": "open", "REDIS_URL": redis_url}
    holding, showing = asgi_server_factory(**env), asgi_server_factory(**env)
    cookie = await database_sync_to_async(_session_cookie)(staff_user)
    row = await database_sync_to_async(BoundDeviceFactory)()
    await _until(showing.http_url, cookie, lambda d: d["devices_online"] == 0 and d["device_sockets"] == 0,
                 "nothing online at first")
    device = SimulatedDevice(holding.http_url, mac=row.mac, client_id=row.client_id, listen_mode="manual")
    await device.connect(f"{holding.ws_url}/xiaozhi/v1/", token="")
    await device.hello()
    data = await _until(showing.http_url, cookie,
                        lambda d: d["devices_online"] == 1 and d["sessions"]["idle"] == 1,
                        "the other process's session, seen through Redis")
    assert data["sessions_available"] and data["processes"] >= 1
    await device.listen_start()
    await _until(showing.http_url, cookie, lambda d: d["sessions"]["listening"] == 1, "listening")
    session_id = device.session_id
    await device.close()
    await session_recorded_closed(session_id)
    await _until(showing.http_url, cookie, lambda d: d["devices_online"] == 0 and d["device_sockets"] == 0,
                 "the device gone on both processes")
