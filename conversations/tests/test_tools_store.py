"""A device's MCP tool list is written to its row only when it changed (a reboot storm
reconnects thousands of devices with the lists they already have)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async  # closes its connection after each call
from django.utils import timezone

from conversations.services import DbSessionHooks
from devices.models import Device
from devices.tests.factories import BoundDeviceFactory

pytestmark = pytest.mark.django_db(transaction=True)

INFO = {"name": "xiaozhi-esp32", "version": "2.4.2"}
TOOLS = [{"name": "self.audio_speaker.set_volume", "description": "Set the volume.",
          "parameters": {"type": "object", "properties": {"volume": {"type": "integer"}}}, "user_only": False}]
LONG_AGO = timezone.now() - timedelta(days=1)


def stored_device(**fields: object) -> Device:
    return BoundDeviceFactory(mcp_tools_updated_at=LONG_AGO, **fields)


def reload(device: Device) -> Device:
    return Device.objects.get(pk=device.pk)


async def test_an_unchanged_tool_list_is_not_rewritten() -> None:
    device = await database_sync_to_async(stored_device)(mcp_server_info=INFO, mcp_tools=TOOLS)
    device = await database_sync_to_async(reload)(device)  # as the consumer reads it at connect
    hooks = DbSessionHooks(device_id=device.pk, persona_id=None,
                           stored_tools=(device.mcp_server_info, device.mcp_tools))
    await hooks.tools_listed(dict(INFO), [dict(tool) for tool in TOOLS])
    assert (await database_sync_to_async(reload)(device)).mcp_tools_updated_at == LONG_AGO


async def test_a_changed_tool_list_is_written() -> None:
    device = await database_sync_to_async(stored_device)(mcp_server_info=INFO, mcp_tools=TOOLS)
    hooks = DbSessionHooks(device_id=device.pk, persona_id=None,
                           stored_tools=(device.mcp_server_info, device.mcp_tools))
    fewer: list[dict] = []
    await hooks.tools_listed(INFO, fewer)
    after = await database_sync_to_async(reload)(device)
    assert after.mcp_tools == [] and after.mcp_tools_updated_at > LONG_AGO
