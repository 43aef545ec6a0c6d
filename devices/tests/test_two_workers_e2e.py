"""Two web workers linked by Redis (PostgreSQL + Redis: the integration tier): a device holds
its socket in one worker; the operator's admin actions (reboot, say, a device tool call) are
served by the other, and presence reads the same from both.

The workers are two server processes on two ports, so which worker serves what is certain;
under `make run` they share one port (xiaozhi_site/webserver.py) and nothing else differs:
they only ever meet through Redis and the database. The whole e2e suite also runs in that
shared-port mode with XIAOZHI_WORKERS=2 (docs/performance.md, "Several workers").
"""
from __future__ import annotations

import asyncio
import html
import json
import re
import time
import urllib.request
from http.cookiejar import CookieJar
from typing import Any
from urllib.parse import urlencode

import pytest
from channels.db import database_sync_to_async

from conversations.tests.factories import PersonaFactory
from devices.models import Device
from devices.services import device_token_issue
from devices.tests.factories import BoundDeviceFactory
from simulator import DeviceMcpServer
from simulator.device import SimulatedDevice

pytestmark = [pytest.mark.integration, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


class Operator:
    """A staff member's browser on one worker: logged in through the form, CSRF and all."""

    def __init__(self, base_url: str, username: str = "alice", password: str = "alice-password") -> None:
        self.base_url = base_url
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
        page = self._get("/admin/login/")
        self._post("/admin/login/?next=/admin/", {"csrfmiddlewaretoken": _csrf(page), "username": username,
                                                  "password": password, "next": "/admin/"})

    def _get(self, path: str) -> str:
        with self.opener.open(f"{self.base_url}{path}", timeout=30) as response:
            return response.read().decode()

    def _post(self, path: str, form: dict[str, Any]) -> str:
        request = urllib.request.Request(f"{self.base_url}{path}", data=urlencode(form, doseq=True).encode())
        with self.opener.open(request, timeout=60) as response:  # follows the redirect to the list
            return response.read().decode()

    def action(self, device: Device, action: str, **fields: Any) -> list[str]:
        """Run a device-list action; returns the messages on the page it leads to."""
        page = self._get("/admin/devices/device/")
        form = {"csrfmiddlewaretoken": _csrf(page), "action": action, "_selected_action": [device.pk],
                "apply": "1", **fields}
        result = self._post("/admin/devices/device/", form)
        found = re.findall(r'<li class="(?:success|error|warning|info)">(.*?)</li>', result, re.S)
        return [html.unescape(re.sub(r"<[^>]+>", "", message)).strip() for message in found]

    def now(self) -> dict[str, Any]:
        return json.loads(self._get("/dashboard/now.json"))


def _csrf(page: str) -> str:
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, "no CSRF token on the page"
    return token.group(1)


async def _until(operator: Operator, check: Any, what: str, timeout: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        data = await asyncio.to_thread(operator.now)
        if check(data):
            return data
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: last figures {data}")
        await asyncio.sleep(0.2)


async def test_a_device_on_one_worker_obeys_admin_actions_served_by_the_other(
        asgi_server_factory: Any, staff_user: Any, redis_url: str) -> None:
    env = {"REDIS_URL": redis_url}
    holding, serving = asgi_server_factory(**env), asgi_server_factory(**env)
    # espeak only: the default edge TTS needs the internet.
    persona = await database_sync_to_async(PersonaFactory)(tts_providers=["espeak"])
    device = await database_sync_to_async(BoundDeviceFactory)(persona=persona)
    token = await database_sync_to_async(device_token_issue)(device=device)
    mcp = DeviceMcpServer.default()
    mcp.set_result("self.get_device_status", {"battery": {"level": 71}})
    on_holding, on_serving = await asyncio.gather(asyncio.to_thread(Operator, holding.http_url),
                                                  asyncio.to_thread(Operator, serving.http_url))

    async with SimulatedDevice(holding.http_url, mac=device.mac, client_id=device.client_id, mcp=mcp) as sim:
        await sim.connect(url=f"{holding.ws_url}/xiaozhi/v1/", token=token)
        await sim.hello()
        # Presence, read through each worker: the row online, the live session counted once.
        for operator in (on_holding, on_serving):
            await _until(operator, lambda d: d["devices_online"] == 1 and d["device_sockets"] == 1,
                         "the device online and its one session live, on both workers")
        row = await database_sync_to_async(Device.objects.get)(pk=device.pk)
        assert row.is_online and row.channel_name and row.mcp_tools

        mark = sim.mark()
        notes = await asyncio.to_thread(on_serving.action, device, "say_on_devices", text="Dinner is ready")
        assert notes == ["Text sent to 1 of 1 device."]
        await sim.wait_for("tts", "stop", since=mark, timeout=20)
        assert "Dinner is ready" in sim.subtitles and sim.downlink_frames

        notes = await asyncio.to_thread(on_serving.action, device, "call_device_tool",
                                        tool="self.get_device_status", arguments="{}", timeout="10")
        assert len(notes) == 1 and notes[0].startswith(f"{device.mac}: self.get_device_status → ")
        assert json.loads(notes[0].split(" → ", 1)[1]) == {"battery": {"level": 71}}

        notes = await asyncio.to_thread(on_serving.action, device, "reboot_devices")
        assert notes == ["Reboot sent to 1 of 1 device."]
        await sim.wait_for(kind="reboot", timeout=10)
    assert sim.reboots == ["system"]

    for operator in (on_holding, on_serving):
        await _until(operator, lambda d: d["devices_online"] == 0 and d["device_sockets"] == 0,
                     "the device gone, on both workers")
