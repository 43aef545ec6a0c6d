"""Commands across OS processes through Redis: the device sits on a daphne subprocess, the
commands come from this test process (and from a `manage.py device_command` subprocess)."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from channels.db import database_sync_to_async
from django.db import connection

from conversations.tests.factories import PersonaFactory
from devices.commands import DeviceToolError, adevice_mcp_call, adevice_send_command
from devices.models import Device
from devices.services import device_token_issue
from devices.tests.factories import BoundDeviceFactory
from simulator import DeviceMcpServer
from simulator.device import SimulatedDevice
from testing.server import BASE_DIR, AsgiServer, database_url

IDLE_LAYER_SECONDS = 6.5

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def _bound_device_speaking_espeak() -> Device:
    # espeak only: the default edge TTS needs the internet and would add its connect timeout.
    persona = PersonaFactory(tts_providers=["espeak"])
    return BoundDeviceFactory(persona=persona)


async def online_with_tools(device: Device, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await database_sync_to_async(device.refresh_from_db)()
        if device.is_online and device.mcp_tools:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the device never came online with its tools")


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "manage.py", *args], cwd=BASE_DIR, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60, check=False)


async def test_commands_from_another_process_reach_the_device_through_redis(
        asgi_server_factory: Callable[..., AsgiServer], redis_url: str) -> None:
    env = {"REDIS_URL": redis_url}
    server = asgi_server_factory(**env)
    device = await database_sync_to_async(_bound_device_speaking_espeak)()
    mcp = DeviceMcpServer.default()
    mcp.set_result("self.get_device_status", {"battery": {"level": 64}})
    token = await database_sync_to_async(device_token_issue)(device=device)
    async with SimulatedDevice(server.http_url, mac=device.mac, client_id=device.client_id, mcp=mcp) as sim:
        await sim.connect(url=f"{server.ws_url}/xiaozhi/v1/", token=token)
        await sim.hello()
        await online_with_tools(device)
        # Longer than channels_redis's 5 s blocking pop: an idle layer must not end the session.
        await asyncio.sleep(IDLE_LAYER_SECONDS)
        assert sim.connected

        assert await adevice_send_command(device=device, command="alert", status="Info", message="Hi",
                                          emotion="happy")
        alert = await sim.wait_for(kind="alert", timeout=5)
        assert alert.payload["message"] == "Hi"

        mark = sim.mark()
        assert await adevice_send_command(device=device, command="say", text="Dinner is ready")
        await sim.wait_for("tts", "stop", since=mark, timeout=15)
        assert "Dinner is ready" in sim.subtitles and sim.downlink_frames

        result = await adevice_mcp_call(device=device, name="self.get_device_status", timeout=5)
        assert json.loads(result) == {"battery": {"level": 64}}
        with pytest.raises(DeviceToolError, match="Unknown tool"):
            await adevice_mcp_call(device=device, name="self.nope", timeout=5)

        # A third process: the management command prints the tool's result.
        env["DATABASE_URL"] = database_url(connection.settings_dict)
        done = await asyncio.to_thread(manage, "device_command", device.mac, "mcp", "self.get_device_status",
                                       env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.strip()) == {"battery": {"level": 64}}

        assert await adevice_send_command(device=device, command="reboot")
        await sim.wait_for(kind="reboot", timeout=5)
    assert sim.reboots == ["system"]


async def test_a_command_to_a_device_connected_nowhere_is_refused(redis_url: str) -> None:
    device = await database_sync_to_async(BoundDeviceFactory)()
    assert not await adevice_send_command(device=device, command="reboot")
