"""The device endpoint end to end: real daphne in a subprocess, the firmware-faithful simulator.

One server for the whole module (starting daphne costs ~1.5 s); each test brings its own
committed rows (transactional tests) and its own device. Commands from services across
processes need Redis: they are in test_commands_redis.py (integration tier).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from conversations.tests.e2e import session_recorded_closed
from conversations.tests.fakes import PLAIN_HELLO
from devices.models import Device
from devices.services import device_token_issue
from devices.tests.factories import BoundDeviceFactory
from simulator import DeviceMcpServer
from simulator.device import DeviceError, SimulatedDevice
from testing.fake_openai import FakeOpenAI, Reply
from testing.server import AsgiServer, database_url

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def vision_model() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(default=Reply(text="A red mug on a desk.")) as fake:
        yield fake


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any, vision_model: FakeOpenAI) -> Iterator[AsgiServer]:
    from django.db import connection

    with django_db_blocker.unblock():
        url = database_url(connection.settings_dict)
    env = {"DATABASE_URL": url, "XIAOZHI_MAX_MESSAGES_PER_SECOND": "50",
           "XIAOZHI_VISION_BASE_URL": vision_model.base_url, "XIAOZHI_VISION_MODEL": "vision-test"}
    with AsgiServer(env=env) as running:
        yield running


@pytest.fixture
async def device() -> Device:
    return await database_sync_to_async(BoundDeviceFactory)()


@pytest.fixture
async def simulator(server: AsgiServer, device: Device) -> AsyncIterator[SimulatedDevice]:
    mcp = DeviceMcpServer.default().with_extra_tools(8)  # 3 pages of tools/list
    async with SimulatedDevice(server.http_url, mac=device.mac, client_id=device.client_id, mcp=mcp) as sim:
        yield sim
    await session_recorded_closed(sim.session_id)


async def connect(sim: SimulatedDevice, server: AsgiServer, device: Device, token: str | None = None,
                  path: str = "/xiaozhi/v1/") -> None:
    token = await database_sync_to_async(device_token_issue)(device=device) if token is None else token
    await sim.connect(url=server.ws_url + path, token=token)


async def closed(sim: SimulatedDevice) -> tuple[int, str]:
    """Who closed and with which code; the reason text is checked in test_consumer.py
    (daphne 4.2 does not forward close reasons)."""
    event = await sim.wait_for(kind="closed", timeout=5)
    assert not [e for e in sim.events if e.kind in ("text", "crash")]  # no stray frames first
    return event.payload["code"], event.payload["by"]


async def alive(sim: SimulatedDevice) -> bool:
    mark = sim.mark()
    await sim.send_raw_text(PLAIN_HELLO)
    await sim.wait_for("hello", since=mark, timeout=3)
    return True


async def stored(device: Device, check: Any, timeout: float = 5.0) -> Device:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await database_sync_to_async(device.refresh_from_db)()
        if check(device):
            return device
        await asyncio.sleep(0.05)
    raise AssertionError("the device row never reached the expected state")


# -- handshake, tools, presence ---------------------------------------------------------------


async def test_the_server_hello_comes_back_within_milliseconds(simulator: SimulatedDevice, server: AsgiServer,
                                                              device: Device) -> None:
    await connect(simulator, server, device)
    started = time.monotonic()
    reply = await simulator.hello()
    assert time.monotonic() - started < 0.25
    assert reply["transport"] == "websocket" and reply["audio_params"]["sample_rate"] == 24000
    assert simulator.session_id == reply["session_id"]
    assert not [e for e in simulator.events if e.kind in ("crash", "protocol_error")]


async def test_a_three_page_tool_list_is_stored_on_the_device(simulator: SimulatedDevice, server: AsgiServer,
                                                             device: Device) -> None:
    await connect(simulator, server, device, path="/xiaozhi/v1")
    await simulator.hello()
    await stored(device, lambda d: d.mcp_tools and d.is_online)
    requests = simulator.mcp.requests
    assert [r["method"] for r in requests][:1] == ["initialize"]
    vision = requests[0]["params"]["capabilities"]["vision"]
    assert vision["url"] == f"{server.http_url}/mcp/vision/explain" and vision["token"]
    pages = [r for r in requests if r["method"] == "tools/list"]
    assert len(pages) == 3 and all(p["params"]["withUserTools"] is True for p in pages)
    assert [t["name"] for t in device.mcp_tools] == [t.name for t in simulator.mcp.tools]
    assert {t["name"] for t in device.mcp_tools if t["user_only"]} >= {"self.reboot", "self.upgrade_firmware"}


async def test_presence_goes_offline_when_the_device_drops_the_socket(simulator: SimulatedDevice,
                                                                     server: AsgiServer, device: Device) -> None:
    await connect(simulator, server, device)
    await simulator.hello()
    await stored(device, lambda d: d.is_online and d.session_id == simulator.session_id)
    await simulator.close()  # like the firmware: TCP dropped, no close frame
    await stored(device, lambda d: not d.is_online)


async def test_the_camera_photo_is_explained_through_the_vision_endpoint(
        simulator: SimulatedDevice, server: AsgiServer, device: Device, vision_model: FakeOpenAI) -> None:
    await connect(simulator, server, device)
    await simulator.hello()
    await stored(device, lambda d: d.mcp_tools)
    # What the firmware does during self.camera.take_photo: a chunked multipart upload to the
    # vision URL from `initialize`, with its token; the body becomes the tool result.
    call = {"jsonrpc": "2.0", "id": 77, "method": "tools/call",
            "params": {"name": "self.camera.take_photo", "arguments": {"question": "What do you see?"}}}
    reply = json.loads(await simulator.mcp.handle(call) or "{}")
    assert reply["result"]["content"][0]["text"] == "A red mug on a desk."
    asked = vision_model.chat_requests[-1]
    assert asked.model == "vision-test" and asked.messages[-1]["content"][0]["text"] == "What do you see?"


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize("token", ["", "AAAA.123"])
async def test_a_device_without_a_valid_token_is_refused_with_4001(
        simulator: SimulatedDevice, server: AsgiServer, device: Device, token: str) -> None:
    await connect(simulator, server, device, token=token)
    assert await closed(simulator) == (4001, "server")


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("frame", [
    "this is not json", '{"type":"ping"}', '{"type":"listen","state":"start","mode":7}',
    '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":4242,"result":{}}}',
    '{"session_id":"","type":"mcp","payload":{"jsonrpc":"2.0","id":"1","result":{}}}',
])
async def test_bad_text_is_ignored_and_the_session_keeps_working(
        simulator: SimulatedDevice, server: AsgiServer, device: Device, frame: str) -> None:
    await connect(simulator, server, device)
    await simulator.hello()
    await simulator.send_raw_text(frame)
    assert await alive(simulator)


async def test_invalid_opus_is_survived(simulator: SimulatedDevice, server: AsgiServer, device: Device) -> None:
    await connect(simulator, server, device)
    await simulator.hello()
    await simulator.listen_start("auto")
    for _ in range(10):
        await simulator.send_raw_bytes(b"\xff\xfe" * 40)
    assert await alive(simulator)


@pytest.mark.parametrize(("action", "code"), [
    ("binary_before_hello", 4400), ("oversized_text", 4413), ("oversized_binary", 4413), ("flood", 4429),
])
async def test_abuse_closes_the_socket_with_its_code(
        simulator: SimulatedDevice, server: AsgiServer, device: Device, action: str, code: int) -> None:
    await connect(simulator, server, device)
    if action == "binary_before_hello":
        await simulator.send_raw_bytes(b"\x01\x02\x03")
    else:
        await simulator.hello()
    if action == "oversized_text":
        await simulator.send_raw_text(json.dumps({"type": "listen", "state": "detect", "text": "x" * 70_000}))
    elif action == "oversized_binary":
        await simulator.send_raw_bytes(b"\x00" * 5000)
    elif action == "flood":
        with contextlib.suppress(DeviceError):  # the server may close mid-burst
            for _ in range(300):
                await simulator.send_raw_text('{"session_id":"","type":"listen","state":"stop"}')
    assert await closed(simulator) == (code, "server")
