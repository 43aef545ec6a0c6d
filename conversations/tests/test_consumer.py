"""DeviceConsumer through the real routing with WebsocketCommunicator (in-process, in-memory layer)."""
from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.messages.storage.cookie import CookieStorage
from django.core.management import CommandError, call_command
from django.http import HttpRequest
from django.test import RequestFactory

from conversations.consumers import DeviceConsumer
from conversations.models import Conversation
from conversations.pipeline.states import MAX_PROTOCOL_ERRORS
from conversations.routing import websocket_urlpatterns
from conversations.tests.fakes import MCP_HELLO, PLAIN_HELLO
from devices.admin_actions import (
    alert_devices,
    call_device_tool,
    device_tools_html,
    reboot_devices,
    say_on_devices,
)
from devices.commands import DeviceOffline, DeviceToolError, adevice_mcp_call, adevice_send_command
from devices.models import Device
from devices.protocol.messages import EMOTIONS
from devices.services import device_token_issue
from devices.tests.factories import BoundDeviceFactory, DeviceFactory
from devices.vision import vision_token_issue
from simulator.mcp_server import DeviceMcpServer
from xiaozhi_site.ws_fastpath import BINARY_TAP, BinaryTap

pytestmark = pytest.mark.django_db(transaction=True)

APP = URLRouter(websocket_urlpatterns)


def headers_for(device: Device, token: str | None = None, **override: str | None) -> list[tuple[bytes, bytes]]:
    values: dict[str, str | None] = {
        "authorization": f"Bearer {device_token_issue(device=device) if token is None else token}",
        "protocol-version": "1", "device-id": device.mac, "client-id": device.client_id, **override,
    }
    return [(k.encode(), v.encode()) for k, v in values.items() if v is not None]


@pytest.fixture
async def device() -> Device:
    return await database_sync_to_async(BoundDeviceFactory)()


@pytest.fixture
async def sockets() -> AsyncIterator[list[WebsocketCommunicator]]:
    opened: list[WebsocketCommunicator] = []
    yield opened
    for communicator in opened:
        await communicator.disconnect()


async def open_socket(sockets: list[WebsocketCommunicator], headers: list[tuple[bytes, bytes]],
                      path: str = "/xiaozhi/v1/") -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(APP, path, headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    sockets.append(communicator)
    return communicator


async def hello(communicator: WebsocketCommunicator, text: str = PLAIN_HELLO) -> dict[str, Any]:
    await communicator.send_to(text_data=text)
    return json.loads(await communicator.receive_from(timeout=2))


async def close_of(communicator: WebsocketCommunicator) -> tuple[int | None, str]:
    while True:
        message = await communicator.receive_output(timeout=2)
        if message["type"] == "websocket.close":
            return message.get("code"), message.get("reason", "")


async def assert_alive(communicator: WebsocketCommunicator) -> None:
    """A repeated hello is answered: the session still reads and answers frames."""
    reply = await hello(communicator)
    assert reply["type"] == "hello"


async def session_of(device: Device, sockets: list[WebsocketCommunicator]) -> WebsocketCommunicator:
    communicator = await open_socket(sockets, headers_for(device))
    reply = await hello(communicator)
    assert reply["type"] == "hello"
    return communicator


# -- handshake and auth ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/xiaozhi/v1/", "/xiaozhi/v1"])
async def test_it_answers_hello_on_both_spellings_of_the_route(device: Device, sockets: list, path: str) -> None:
    communicator = await open_socket(sockets, headers_for(device), path)
    reply = await hello(communicator)
    assert reply["transport"] == "websocket" and reply["audio_params"]["sample_rate"] == 24000


async def test_browsers_may_authenticate_with_query_parameters(device: Device, sockets: list) -> None:
    token = device_token_issue(device=device)
    path = f"/xiaozhi/v1/?device-id={device.mac}&client-id={device.client_id}&authorization=Bearer%20{token}"
    communicator = await open_socket(sockets, [], path)
    assert (await hello(communicator))["type"] == "hello"


@pytest.mark.parametrize(("override", "reason"), [
    ({"device-id": None}, "device id missing"),
    ({"device-id": "not-a-mac"}, "device id invalid"),
    ({"device-id": "02:00:00:ff:ff:ff"}, "device unknown"),
    ({"authorization": None}, "token missing"),
    ({"authorization": "Bearer nonsense"}, "token invalid"),
    ({"client-id": "someone-else"}, "token invalid"),
])
async def test_refused_devices_get_4001_and_a_reason(device: Device, sockets: list, override: dict,
                                                    reason: str) -> None:
    communicator = await open_socket(sockets, headers_for(device, **override))
    assert await close_of(communicator) == (4001, reason)


async def test_an_unbound_device_is_refused_with_4003_when_policy_says_so(sockets: list, settings: Any) -> None:
    settings.XIAOZHI_UNBOUND_POLICY = "refuse"
    unbound = await database_sync_to_async(DeviceFactory)()
    communicator = await open_socket(sockets, headers_for(unbound))
    assert await close_of(communicator) == (4003, "device not activated")


async def test_open_mode_lets_an_unknown_device_in(sockets: list, settings: Any) -> None:
    settings.XIAOZHI_WS_AUTH = "open"
    settings.XIAOZHI_UNBOUND_POLICY = "allow"
    headers = [(b"device-id", b"02:00:00:0a:0a:0a"), (b"client-id", b"c1")]
    communicator = await open_socket(sockets, headers)
    assert (await hello(communicator))["type"] == "hello"


async def test_it_closes_with_1013_over_the_connection_limit(device: Device, sockets: list, settings: Any) -> None:
    settings.XIAOZHI_MAX_DEVICE_CONNECTIONS = DeviceConsumer.active_connections + 1
    await session_of(device, sockets)
    second = await open_socket(sockets, headers_for(device))
    assert await close_of(second) == (1013, "too many connections")


async def test_a_bound_device_is_authenticated_and_set_up_in_one_database_hop(
        device: Device, sockets: list, database_hops: list[object]) -> None:
    # Waking a database thread is paid per device, thousands of times in a reboot storm.
    headers = headers_for(device)
    database_hops.clear()
    communicator = await open_socket(sockets, headers)
    assert len(database_hops) == 1
    assert (await hello(communicator))["type"] == "hello"


async def test_a_refused_handshake_gives_its_slot_back(device: Device, sockets: list) -> None:
    before = DeviceConsumer.active_connections
    refused = await open_socket(sockets, headers_for(device, token="forged.1"))
    assert await close_of(refused) == (4001, "token invalid")
    assert DeviceConsumer.active_connections == before


async def test_a_second_socket_of_the_same_device_replaces_the_first(device: Device, sockets: list) -> None:
    first = await session_of(device, sockets)
    second = await session_of(device, sockets)
    assert await close_of(first) == (4409, "replaced by a new connection")
    await assert_alive(second)


async def test_unbound_devices_get_1013_once_their_share_of_slots_is_taken(
        device: Device, sockets: list, settings: Any) -> None:
    settings.XIAOZHI_MAX_UNBOUND_DEVICE_CONNECTIONS = DeviceConsumer.unbound_connections + 1
    # No code to issue at connect: that write can meet SQLite's "database is locked" while
    # the first session writes its presence (issue 11 item 3, fixed with WAL elsewhere).
    settings.XIAOZHI_UNBOUND_POLICY = "allow"
    unbound = [await database_sync_to_async(DeviceFactory)() for _ in range(2)]
    assert (await hello(await open_socket(sockets, headers_for(unbound[0]))))["type"] == "hello"
    refused = await open_socket(sockets, headers_for(unbound[1]))
    assert await close_of(refused) == (1013, "too many connections")
    await session_of(device, sockets)  # a bound device still gets in


async def test_presence_follows_the_session_and_a_silent_session_leaves_no_conversation(
        device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    for _ in range(50):
        await database_sync_to_async(device.refresh_from_db)()
        if device.is_online:
            break
        await asyncio.sleep(0.02)
    assert device.is_online
    session_id = device.session_id
    await communicator.disconnect()
    sockets.remove(communicator)
    await database_sync_to_async(device.refresh_from_db)()
    assert not device.is_online and device.last_seen_at is not None
    # A conversation row is created with its first turn (issue 11): none for a session without one.
    assert not await Conversation.objects.filter(session_id=session_id).aexists()


# -- bad input ------------------------------------------------------------------------------


async def test_malformed_json_is_ignored_and_the_session_goes_on(device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    await communicator.send_to(text_data='{"type": "listen", ')
    await assert_alive(communicator)


async def test_an_unknown_type_is_ignored(device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    await communicator.send_to(text_data='{"type":"ping"}')
    await assert_alive(communicator)


async def test_wrong_field_types_are_ignored(device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    await communicator.send_to(text_data='{"type":"listen","state":"start","mode":42}')
    await communicator.send_to(text_data='{"type":"mcp","payload":[1]}')
    await assert_alive(communicator)


async def test_binary_before_hello_closes_with_4400(device: Device, sockets: list) -> None:
    communicator = await open_socket(sockets, headers_for(device))
    await communicator.send_to(bytes_data=b"\x01\x02\x03")
    assert await close_of(communicator) == (4400, "binary before hello")


async def test_oversized_text_closes_with_4413(device: Device, sockets: list, settings: Any) -> None:
    settings.XIAOZHI_MAX_TEXT_BYTES = 1024
    communicator = await session_of(device, sockets)
    await communicator.send_to(text_data='{"type":"listen","state":"detect","text":"' + "x" * 4096 + '"}')
    assert await close_of(communicator) == (4413, "message too large")


async def test_oversized_binary_closes_with_4413(device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    await communicator.send_to(bytes_data=b"\x00" * 5000)
    assert await close_of(communicator) == (4413, "binary frame too large")


async def test_invalid_opus_does_not_break_the_session(device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    await communicator.send_to(text_data='{"session_id":"","type":"listen","state":"start","mode":"auto"}')
    for _ in range(5):
        await communicator.send_to(bytes_data=b"\xff\xfe\xfd" * 20)
    await assert_alive(communicator)


async def test_a_server_tap_gets_audio_once_nothing_is_ahead_and_is_let_go_at_disconnect(device: Device) -> None:
    tap = BinaryTap()  # what daphne's scope carries (xiaozhi_site/ws_fastpath.py)
    communicator = WebsocketCommunicator(APP, "/xiaozhi/v1/", headers=headers_for(device))
    communicator.scope["extensions"] = {BINARY_TAP: tap}
    assert (await communicator.connect())[0]
    assert tap.sink is not None and not tap.sink(b"\x01")  # before the hello: left to the queue (4400)
    await hello(communicator)
    consumer = tap.sink.__self__
    assert isinstance(consumer, DeviceConsumer) and consumer.session is not None
    await communicator.send_to(text_data='{"session_id":"","type":"listen","state":"start","mode":"auto"}')
    await assert_alive(communicator)  # the listen start was handled before the hello after it
    session = consumer.session
    assert tap.sink(b"\xf8\xff\xfe") and session.stats.audio_to_engine == 1
    consumer._frames_in_hand = 1  # a socket message taken from the queue, its handler not done
    assert not tap.sink(b"\xf8\xff\xfe")
    consumer._frames_in_hand, consumer._dispatching = 0, True  # a handler running (awaiting)
    assert not tap.sink(b"\xf8\xff\xfe")
    consumer._dispatching = False
    assert tap.sink(b"\xf8\xff\xfe") and session.stats.audio_to_engine == 2
    await communicator.disconnect()
    assert tap.sink is None


async def test_mcp_replies_with_wrong_ids_are_dropped(device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    for payload in ('{"jsonrpc":"2.0","id":12345,"result":{}}', '{"jsonrpc":"2.0","id":"x","result":{}}',
                    '{"jsonrpc":"2.0","method":"notifications/state_changed","params":{}}'):
        await communicator.send_to(text_data='{"session_id":"","type":"mcp","payload":' + payload + "}")
    await assert_alive(communicator)


async def test_a_message_flood_closes_with_4429(device: Device, sockets: list, settings: Any) -> None:
    settings.XIAOZHI_MAX_MESSAGES_PER_SECOND = 20
    communicator = await session_of(device, sockets)
    for _ in range(100):
        await communicator.send_to(text_data='{"session_id":"","type":"listen","state":"stop"}')
    assert await close_of(communicator) == (4429, "too many messages")


async def test_repeated_protocol_errors_close_with_4400(device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    for _ in range(MAX_PROTOCOL_ERRORS):
        await communicator.send_to(text_data="garbage")
    assert await close_of(communicator) == (4400, "too many protocol errors")


# -- device MCP and commands (in-process channel layer) ---------------------------------------


class FirmwareMcp:
    """Reads everything the server sends; answers MCP like the firmware, keeps the rest."""

    def __init__(self, communicator: WebsocketCommunicator, server: DeviceMcpServer) -> None:
        self.communicator = communicator
        self.server = server
        self.messages: list[dict[str, Any]] = []
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            output = await self.communicator.receive_output(timeout=30)
            if output["type"] != "websocket.send" or output.get("text") is None:
                continue
            message = json.loads(output["text"])
            if message["type"] != "mcp":
                self.messages.append(message)
                continue
            reply = await self.server.handle(message["payload"])
            if reply is not None:
                await self.communicator.send_to(text_data='{"session_id":"","type":"mcp","payload":' + reply + "}")

    async def wait_for(self, kind: str, timeout: float = 3.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                found = [m for m in self.messages if m["type"] == kind]
                if found:
                    return found[-1]
                await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def firmware(device: Device, sockets: list) -> AsyncIterator[FirmwareMcp]:
    communicator = await open_socket(sockets, headers_for(device))
    assert (await hello(communicator, MCP_HELLO))["type"] == "hello"
    server = DeviceMcpServer.default().with_extra_tools(8)
    server.set_result("self.get_device_status", {"battery": {"level": 77}})
    fake = FirmwareMcp(communicator, server)
    yield fake
    await fake.stop()


async def stored_tools(device: Device) -> list[dict[str, Any]]:
    for _ in range(100):
        await database_sync_to_async(device.refresh_from_db)()
        if device.mcp_tools and device.is_online:
            return device.mcp_tools
        await asyncio.sleep(0.02)
    raise AssertionError("the tool list was not stored")


async def test_the_device_tool_list_is_stored_with_user_only_marks(device: Device, firmware: FirmwareMcp) -> None:
    tools = await stored_tools(device)
    assert len(tools) == len(firmware.server.tools)
    assert {t["name"]: t["user_only"] for t in tools}["self.reboot"] is True
    assert device.mcp_server_info["name"] == "bread-compact-wifi"


async def test_reboot_and_alert_reach_the_device_through_the_layer(device: Device, firmware: FirmwareMcp) -> None:
    await stored_tools(device)
    assert await adevice_send_command(device=device, command="reboot")
    assert (await firmware.wait_for("system"))["command"] == "reboot"
    assert await adevice_send_command(device=device, command="alert", status="Warning", message="Hot",
                                      emotion=EMOTIONS[0])
    alert = await firmware.wait_for("alert")
    assert (alert["status"], alert["message"], alert["emotion"]) == ("Warning", "Hot", "neutral")


async def test_an_mcp_call_result_comes_back_to_the_service(device: Device, firmware: FirmwareMcp) -> None:
    await stored_tools(device)
    result = await adevice_mcp_call(device=device, name="self.get_device_status", timeout=3)
    assert json.loads(result) == {"battery": {"level": 77}}
    with pytest.raises(DeviceToolError, match="Unknown tool: self.nope"):
        await adevice_mcp_call(device=device, name="self.nope", timeout=3)


async def test_a_pending_tool_call_fails_at_once_when_the_device_drops(
        device: Device, firmware: FirmwareMcp, sockets: list) -> None:
    await stored_tools(device)
    called = asyncio.Event()

    async def never(_arguments: dict) -> bool:
        called.set()
        await asyncio.sleep(60)
        return True

    firmware.server.set_handler("self.get_device_status", never)
    call = asyncio.get_running_loop().create_task(
        adevice_mcp_call(device=device, name="self.get_device_status", timeout=20))
    # The drop must come after the call reached the device: a fixed pause lost that race on a
    # loaded CI machine, and then the call rightly waited for its own timeout.
    async with asyncio.timeout(5):
        await called.wait()
    await firmware.stop()
    await firmware.communicator.disconnect()
    sockets.remove(firmware.communicator)
    async with asyncio.timeout(3):
        with pytest.raises(DeviceOffline, match="disconnected"):
            await call


async def test_an_unknown_channel_layer_event_does_not_kill_the_connection(device: Device, sockets: list) -> None:
    communicator = await session_of(device, sockets)
    layer = get_channel_layer()
    await layer.group_send(f"device.{device.pk}", {"type": "device.dance"})
    await layer.group_send(f"device.{device.pk}", {"type": "device.command", "command": "dance"})
    await assert_alive(communicator)


async def test_an_mcp_call_to_an_offline_device_fails_at_once(device: Device) -> None:
    with pytest.raises(DeviceOffline):
        await adevice_mcp_call(device=device, name="self.get_device_status", timeout=3)


async def test_the_vision_token_cannot_open_a_websocket(device: Device, sockets: list) -> None:
    token = await database_sync_to_async(vision_token_issue)(device=device)
    communicator = await open_socket(sockets, headers_for(device, token=token, **{"client-id": "vision"}))
    assert await close_of(communicator) == (4001, "token invalid")


# -- the admin's actions and manage.py, against a live session --------------------------------


def admin_request(data: dict[str, Any] | None = None) -> HttpRequest:
    request = RequestFactory().post("/admin/devices/device/", data or {})
    request.user = get_user_model()(username="admin", is_staff=True, is_superuser=True)
    request._messages = CookieStorage(request)  # type: ignore[attr-defined]
    return request


def run_action(action: Any, data: dict[str, Any], device: Device) -> tuple[Any, list[str]]:
    request = admin_request(data)
    response = action(admin.site._registry[Device], request, Device.objects.filter(pk=device.pk))
    if response is not None:
        response.render()
    return response, [str(m) for m in request._messages]  # type: ignore[attr-defined]


async def test_admin_reboot_and_alert_actions_reach_the_device(device: Device, firmware: FirmwareMcp) -> None:
    await stored_tools(device)
    _, notes = await sync_to_async(run_action)(reboot_devices, {}, device)
    assert (await firmware.wait_for("system"))["command"] == "reboot"
    assert notes == ["Reboot sent to 1 of 1 device."]
    form_page, _ = await sync_to_async(run_action)(alert_devices, {}, device)
    assert b'name="message"' in form_page.content and b'value="alert_devices"' in form_page.content
    data = {"apply": "1", "message": "Hot", "status": "Warning", "emotion": "sad"}
    response, notes = await sync_to_async(run_action)(alert_devices, data, device)
    alert = await firmware.wait_for("alert")
    assert response is None and (alert["message"], alert["emotion"]) == ("Hot", "sad")


async def test_admin_say_action_speaks_the_text(device: Device, firmware: FirmwareMcp) -> None:
    await stored_tools(device)
    await sync_to_async(run_action)(say_on_devices, {"apply": "1", "text": "Dinner is ready"}, device)
    sentence = await firmware.wait_for("tts", timeout=10)
    assert sentence["session_id"]
    async with asyncio.timeout(10):
        while not any(m.get("state") == "stop" for m in firmware.messages if m["type"] == "tts"):
            await asyncio.sleep(0.02)
    assert [m["text"] for m in firmware.messages if m.get("state") == "sentence_start"] == ["Dinner is ready"]


async def test_admin_tool_call_shows_the_result(device: Device, firmware: FirmwareMcp) -> None:
    await stored_tools(device)
    data = {"apply": "1", "tool": "self.get_device_status", "arguments": "{}", "timeout": "3"}
    _, notes = await sync_to_async(run_action)(call_device_tool, data, device)
    assert notes == [f'{device.mac}: self.get_device_status → {{"battery":{{"level":77}}}}']
    bad = {**data, "arguments": "[1]"}
    form_page, _ = await sync_to_async(run_action)(call_device_tool, bad, device)
    assert b"Arguments must be a JSON object." in form_page.content


async def test_the_admin_shows_stored_tools_with_user_only_marked(device: Device, firmware: FirmwareMcp) -> None:
    await stored_tools(device)
    html = str(device_tools_html(device))
    row = {line.split("</code>")[0].split("<code>")[-1]: line for line in html.split("<tr>")[2:]}
    assert "[user only]" in row["self.reboot"] and "[user only]" not in row["self.get_device_status"]
    assert "volume: integer" in row["self.audio_speaker.set_volume"]


async def test_manage_py_device_command_prints_the_tool_result(device: Device, firmware: FirmwareMcp) -> None:
    await stored_tools(device)
    out, err = io.StringIO(), io.StringIO()
    await sync_to_async(call_command)("device_command", device.mac, "mcp", "self.get_device_status",
                                      "--timeout", "3", stdout=out, stderr=err)
    assert json.loads(out.getvalue()) == {"battery": {"level": 77}}
    await sync_to_async(call_command)("device_command", device.mac, "reboot", stdout=out, stderr=err)
    assert (await firmware.wait_for("system"))["command"] == "reboot"


async def test_manage_py_device_command_reports_an_offline_device(device: Device) -> None:
    with pytest.raises(CommandError, match="offline"):
        await sync_to_async(call_command)("device_command", device.mac, "say", "hi", stderr=io.StringIO())


def test_devices_left_online_by_a_crash_are_marked_offline_at_startup() -> None:
    crashed = BoundDeviceFactory(is_online=True, session_id="old")
    call_command("devices_startup", stdout=io.StringIO())
    crashed.refresh_from_db()
    assert not crashed.is_online
