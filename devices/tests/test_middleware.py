"""DeviceAuthMiddleware: the handshake decision lands in the scope before the app runs."""
from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.testing import WebsocketCommunicator

from devices.middleware import DeviceAuthMiddleware
from devices.models import Device
from devices.protocol.close_codes import CloseCode
from devices.services import device_token_issue
from devices.tests.factories import BoundDeviceFactory, DeviceFactory

pytestmark = pytest.mark.django_db(transaction=True)


class ScopeRecorder(AsyncJsonWebsocketConsumer):
    """Accepts, then sends back what the middleware put into its scope."""

    async def connect(self) -> None:
        await self.accept()
        auth = self.scope["device_auth"]
        device = self.scope["device"]
        await self.send_json({"ok": auth.ok, "code": auth.close_code, "reason": auth.reason,
                              "bound": auth.bound, "device": device.mac if device else None})


async def scope_for(headers: dict[str, str], query: str = "") -> dict[str, Any]:
    app = DeviceAuthMiddleware(ScopeRecorder.as_asgi())
    path = "/xiaozhi/v1/" + (f"?{query}" if query else "")
    communicator = WebsocketCommunicator(app, path, headers=[(k.encode(), v.encode()) for k, v in headers.items()])
    connected, _ = await communicator.connect()
    assert connected
    reply = await communicator.receive_json_from()
    await communicator.disconnect()
    return reply


def handshake(device: Device, **override: str) -> dict[str, str]:
    return {"authorization": f"Bearer {device_token_issue(device=device)}", "device-id": device.mac,
            "client-id": device.client_id, **override}


async def test_it_puts_the_authenticated_device_into_the_scope() -> None:
    device = await database_sync_to_async(BoundDeviceFactory)()
    headers = await database_sync_to_async(handshake)(device)
    assert await scope_for(headers) == {"ok": True, "code": None, "reason": "", "bound": True, "device": device.mac}


async def test_a_refused_handshake_leaves_no_device_and_says_why() -> None:
    device = await database_sync_to_async(BoundDeviceFactory)()
    headers = await database_sync_to_async(handshake)(device, authorization="Bearer forged.1")
    assert await scope_for(headers) == {"ok": False, "code": CloseCode.AUTH_FAILED, "reason": "token invalid",
                                        "bound": False, "device": None}


async def test_query_parameters_work_for_browser_test_pages() -> None:
    device = await database_sync_to_async(DeviceFactory)()
    token = await database_sync_to_async(device_token_issue)(device=device)
    query = f"device-id={device.mac}&client-id={device.client_id}&authorization=Bearer%20{token}"
    reply = await scope_for({}, query)
    assert reply["ok"] and reply["bound"] is False and reply["device"] == device.mac
