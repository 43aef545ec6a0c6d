"""Identity beyond the MAC, end to end: the real server, the firmware-faithful simulator and
the admin an operator uses.

A device is bound to the Client-Id it was activated with; someone who knows only the MAC
gets no token and shows up as a re-pairing request; "revoke tokens" means "activate
again"; a known key must be proven; a second socket replaces the first.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.contrib.auth import get_user_model
from django.test import Client

from devices.models import Device, DeviceKey, PairingRequest
from devices.protocol.close_codes import CloseCode
from devices.services import device_bind
from simulator.device import SimulatedDevice
from devices.tests.factories import DeviceKeyFactory, UserFactory
from testing.server import AsgiServer

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

MAC = "02:00:00:1d:00:01"
OWNER_CLIENT = "0f8e1c2a-3b4d-4e5f-8a9b-1c2d3e4f5a6b"
OTHER_CLIENT = "9a9a9a9a-0000-4000-8000-000000000001"


def operator() -> Client:
    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


async def admin_post(client: Client, path: str, data: dict[str, Any]) -> Any:
    return await sync_to_async(client.post)(path, data)


async def bind_shown_code(sim: SimulatedDevice) -> Device:
    """What the operator does: read the code off the device and enter it in the admin."""
    code = sim.activation["code"]  # type: ignore[index]
    owner = await database_sync_to_async(UserFactory)()
    return await database_sync_to_async(device_bind)(code=code, owner=owner)


async def provisioned(server: AsgiServer, **identity: Any) -> SimulatedDevice:
    """A device that booted, was bound by an operator, and got its token."""
    sim = SimulatedDevice(server.http_url, mac=MAC, client_id=OWNER_CLIENT, **identity)
    await sim.ota_check()
    await bind_shown_code(sim)
    assert await sim.activate() == 200
    reply = await sim.ota_check()
    assert "activation" not in reply and reply["websocket"]["token"]
    return sim


async def device_row() -> Device:
    return await database_sync_to_async(Device.objects.get)(mac=MAC)


async def close_code_of(sim: SimulatedDevice, token: str | None = None) -> tuple[int, str]:
    mark = sim.mark()
    await sim.connect(token=token)
    closed = await sim.wait_for(kind="closed", since=mark, timeout=10)
    return closed.payload["code"], closed.payload["reason"]


async def test_someone_who_knows_only_the_mac_gets_no_token_and_changes_nothing(asgi_server: AsgiServer) -> None:
    owner = await provisioned(asgi_server)
    before = await device_row()

    stranger = SimulatedDevice(asgi_server.http_url, mac=MAC, client_id=OTHER_CLIENT, board="other-board",
                               firmware_version="9.9.9")
    reply = await stranger.ota_check()

    assert reply["websocket"]["token"] == "" and reply["websocket"]["url"]
    assert reply["firmware"] == {"version": "9.9.9", "url": "", "force": 0}
    assert "code" not in reply["activation"] and reply["activation"]["challenge"]
    after = await device_row()
    assert (after.client_id, after.board_type, after.firmware_version, after.last_checkin_at) == (
        before.client_id, before.board_type, before.firmware_version, before.last_checkin_at)
    # Neither without a token nor with the owner's token does the stranger get a socket.
    assert await close_code_of(stranger) == (CloseCode.AUTH_FAILED, "token missing")
    owner_token = owner.nvs["websocket"]["token"]
    assert await close_code_of(stranger, token=owner_token) == (CloseCode.AUTH_FAILED, "token invalid")
    # The owner is unaffected.
    await owner.connect()
    assert (await owner.hello())["type"] == "hello"
    await owner.close()


async def test_a_reflashed_device_is_re_paired_once_the_operator_approves(asgi_server: AsgiServer) -> None:
    await provisioned(asgi_server)
    reflashed = SimulatedDevice(asgi_server.http_url, mac=MAC, client_id=OTHER_CLIENT)  # NVS erased
    await reflashed.ota_check()
    assert await reflashed.activate() == 202

    admin = await sync_to_async(operator)()
    listing = await sync_to_async(admin.get)("/admin/devices/pairingrequest/")
    assert OTHER_CLIENT in listing.content.decode()
    devices = await sync_to_async(admin.get)("/admin/devices/device/", {"repairing": "requested"})
    assert MAC in devices.content.decode()
    pairing = await database_sync_to_async(PairingRequest.objects.get)(client_id=OTHER_CLIENT)
    response = await admin_post(admin, "/admin/devices/pairingrequest/",
                                {"action": "approve", "_selected_action": [pairing.pk]})
    assert response.status_code == 302

    assert await reflashed.activate() == 200  # the firmware's poll ends, it checks again
    reply = await reflashed.ota_check()
    assert reply["websocket"]["token"] and "activation" not in reply
    assert (await device_row()).client_id == OTHER_CLIENT
    await reflashed.connect()
    assert (await reflashed.hello())["type"] == "hello"
    await reflashed.close()


async def test_a_rejected_request_leaves_the_device_with_its_owner(asgi_server: AsgiServer) -> None:
    owner = await provisioned(asgi_server)
    stranger = SimulatedDevice(asgi_server.http_url, mac=MAC, client_id=OTHER_CLIENT)
    await stranger.ota_check()
    admin = await sync_to_async(operator)()
    pairing = await database_sync_to_async(PairingRequest.objects.get)(client_id=OTHER_CLIENT)
    await admin_post(admin, "/admin/devices/pairingrequest/", {"action": "reject", "_selected_action": [pairing.pk]})

    assert await stranger.activate() == 403  # no open request: the poll is refused
    assert (await owner.ota_check())["websocket"]["token"]


async def test_after_revoking_tokens_the_device_must_be_activated_again(asgi_server: AsgiServer) -> None:
    sim = await provisioned(asgi_server)
    old_token = sim.nvs["websocket"]["token"]
    device = await device_row()
    admin = await sync_to_async(operator)()
    await admin_post(admin, "/admin/devices/device/", {"action": "revoke_tokens", "_selected_action": [device.pk]})

    reply = await sim.ota_check()
    assert reply["websocket"]["token"] == ""
    assert reply["activation"]["code"].isdigit() and reply["activation"]["challenge"]
    assert await sim.activate() == 202
    assert await close_code_of(sim, token=old_token) == (CloseCode.AUTH_FAILED, "device revoked")

    await bind_shown_code(sim)
    assert await sim.activate() == 200
    assert (await sim.ota_check())["websocket"]["token"]


async def test_a_known_key_must_be_proven_whatever_activation_version_is_claimed(
        asgi_server: AsgiServer) -> None:
    key = await database_sync_to_async(DeviceKeyFactory)(serial_number="SN-ID-1")
    chip = SimulatedDevice(asgi_server.http_url, mac=MAC, client_id=OWNER_CLIENT, serial_number="SN-ID-1",
                           hmac_key=bytes.fromhex(key.key_hex))
    await chip.ota_check()
    assert await chip.activate() == 202  # version 2 with the right proof

    downgraded = SimulatedDevice(asgi_server.http_url, mac=MAC, client_id=OWNER_CLIENT)  # v1, no serial
    await downgraded.ota_check()
    assert await downgraded.activate() == 400  # "{}" without the proof: hmac_required
    assert await database_sync_to_async(DeviceKey.objects.count)() == 1


async def test_a_second_connection_replaces_the_first(asgi_server: AsgiServer) -> None:
    first = await provisioned(asgi_server)
    second = SimulatedDevice(asgi_server.http_url, mac=MAC, client_id=OWNER_CLIENT)
    second.nvs["websocket"].update(first.nvs["websocket"])
    await first.connect()
    await first.hello()

    await second.connect()
    hello = await second.hello()

    closed = await first.wait_closed(timeout=10)
    assert (closed.payload["code"], closed.payload["reason"]) == (CloseCode.REPLACED, "replaced by a new connection")
    device = await wait_for_device(lambda d: d.is_online and d.session_id == hello["session_id"])
    assert device.channel_name
    await second.close()
    device = await wait_for_device(lambda d: not d.is_online)
    assert device.channel_name == ""


async def wait_for_device(condition: Any, timeout: float = 10.0) -> Device:
    deadline = time.monotonic() + timeout
    while True:
        device = await device_row()
        if condition(device):
            return device
        if time.monotonic() > deadline:
            raise AssertionError(f"device state not reached: online={device.is_online} session={device.session_id}")
        await asyncio.sleep(0.05)
