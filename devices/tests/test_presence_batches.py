"""Presence writes of many sessions at once (a reboot storm, a mass disconnect) land in batches."""
from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async  # closes its connection after each call

from devices.models import Device
from devices.presence import device_connection_claim, devices_mark_offline
from devices.presence_writer import BatchWriter
from devices.tests.factories import BoundDeviceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(count: int) -> list[tuple[Device, str]]:
    devices = [BoundDeviceFactory() for _ in range(count)]
    sessions = [f"session-{device.pk}" for device in devices]
    for device, session in zip(devices, sessions, strict=True):
        device_connection_claim(device_id=device.pk, session_id=session, channel_name=f"channel-{device.pk}")
    return list(zip(devices, sessions, strict=True))


async def test_sessions_closing_together_go_offline_in_one_update() -> None:
    rows = await database_sync_to_async(claimed)(20)
    batches: list[int] = []

    def write(*, session_ids: list[str]) -> int:
        batches.append(len(session_ids))
        return devices_mark_offline(session_ids=session_ids)

    writer = BatchWriter("offline", write)
    await asyncio.gather(*(writer.submit(session) for _, session in rows))
    assert batches == [20]
    online = await database_sync_to_async(lambda: Device.objects.filter(is_online=True).count())()
    assert online == 0

