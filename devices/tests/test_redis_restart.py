"""Commands after a Redis restart, against a real Redis that this test starts, kills and
starts again (no persistence: everything Redis held is gone, as after a crash).

Before: the first admin command after the restart was a 500, and later commands were
reported sent but never reached sockets opened before the restart (their group
memberships lived in Redis). Now the consumer listens on a channel whose name is stored
with the device, the layer reconnects, and the admin is told when a command really failed.
"""
from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client

from devices.models import Device
from devices.services import device_token_issue
from simulator.device import SimulatedDevice
from conversations.tests.factories import PersonaFactory
from devices.tests.factories import BoundDeviceFactory
from testing.server import free_port

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class RedisServer:
    """A private redis-server on a free loopback port; `restart()` loses all its data."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.directory = directory
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_connect_timeout=0.5).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


def layer_settings(url: str) -> dict[str, Any]:
    return {"default": {"BACKEND": "devices.layers.ResilientRedisChannelLayer",
                        "CONFIG": {"hosts": [{"address": url, "socket_timeout": 15}], "capacity": 200, "expiry": 30}}}


def operator() -> Client:
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def admin_action(client: Client, device: Device, action: str, **fields: str) -> tuple[int, list[str]]:
    """Run a device-list action like the operator's browser: the status of the POST (a 500
    before the fix) and the messages shown on the page it redirects to."""
    response = client.post("/admin/devices/device/", {"action": action, "_selected_action": [device.pk],
                                                      "apply": "1", **fields}, follow=True)
    status = response.redirect_chain[0][1] if response.redirect_chain else response.status_code
    return status, [str(message) for message in response.context["messages"]]


async def test_commands_still_reach_a_device_after_redis_restarts(
        asgi_server_factory: Any, own_redis: RedisServer, settings: Any) -> None:
    settings.CHANNEL_LAYERS = layer_settings(own_redis.url)  # this process: the admin's side
    server = asgi_server_factory(REDIS_URL=own_redis.url)
    # espeak only: the default edge TTS needs the internet.
    device = await database_sync_to_async(BoundDeviceFactory)(persona=await database_sync_to_async(PersonaFactory)(
        tts_providers=["espeak"]))
    token = await database_sync_to_async(device_token_issue)(device=device)
    admin = await sync_to_async(operator)()
    async with SimulatedDevice(server.http_url, mac=device.mac, client_id=device.client_id, features={}) as sim:
        await sim.connect(url=f"{server.ws_url}/xiaozhi/v1/", token=token)
        await sim.hello()
        await _online(device)
        status, notes = await sync_to_async(admin_action)(admin, device, "alert_devices", message="before",
                                                          status="Info", emotion="happy")
        assert status == 302 and notes == ["Alert sent to 1 of 1 device."]
        await sim.wait_for(lambda event: event.kind == "alert" and event.payload["message"] == "before", timeout=10)

        await asyncio.to_thread(own_redis.restart)

        status, notes = await sync_to_async(admin_action)(admin, device, "alert_devices", message="after",
                                                          status="Info", emotion="happy")
        assert status == 302 and notes == ["Alert sent to 1 of 1 device."]
        await sim.wait_for(lambda event: event.kind == "alert" and event.payload["message"] == "after", timeout=15)
        mark = sim.mark()
        status, notes = await sync_to_async(admin_action)(admin, device, "say_on_devices", text="Dinner is ready")
        assert status == 302 and notes == ["Text sent to 1 of 1 device."]
        await sim.wait_for("tts", "stop", since=mark, timeout=20)
        assert "Dinner is ready" in sim.subtitles and sim.connected


async def test_the_admin_is_told_when_redis_is_down(asgi_server_factory: Any, own_redis: RedisServer,
                                                    settings: Any) -> None:
    settings.CHANNEL_LAYERS = layer_settings(own_redis.url)
    server = asgi_server_factory(REDIS_URL=own_redis.url)
    device = await database_sync_to_async(BoundDeviceFactory)()
    token = await database_sync_to_async(device_token_issue)(device=device)
    admin = await sync_to_async(operator)()
    async with SimulatedDevice(server.http_url, mac=device.mac, client_id=device.client_id, features={}) as sim:
        await sim.connect(url=f"{server.ws_url}/xiaozhi/v1/", token=token)
        await sim.hello()
        await _online(device)
        await asyncio.to_thread(own_redis.stop)

        status, notes = await sync_to_async(admin_action)(admin, device, "reboot_devices")

    assert status == 302
    assert notes[0].startswith("Reboot failed for 1 device:") and "Redis" in notes[0]
    assert notes[1] == "Reboot sent to 0 of 1 device."


async def _online(device: Device, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await database_sync_to_async(device.refresh_from_db)()
        if device.is_online:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the device never came online")
