"""Presence writes of many sessions at once (a reboot storm, a mass disconnect) land in batches."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.db import database_sync_to_async  # closes its connection after each call

from devices.models import Device
from devices.presence import device_connection_claim, device_mark_offline, devices_mark_online
from devices.presence_writer import BatchWriter, online_writer
from devices.tests.factories import BoundDeviceFactory

pytestmark = pytest.mark.django_db(transaction=True)


def claimed(count: int) -> list[tuple[Device, str]]:
    devices = [BoundDeviceFactory() for _ in range(count)]
    sessions = [f"session-{device.pk}" for device in devices]
    for device, session in zip(devices, sessions, strict=True):
        device_connection_claim(device_id=device.pk, session_id=session, channel_name=f"channel-{device.pk}")
    return list(zip(devices, sessions, strict=True))


async def test_sessions_saying_hello_together_go_online_in_one_update() -> None:
    rows = await database_sync_to_async(claimed)(20)
    batches: list[int] = []

    def write(*, session_ids: list[str]) -> int:
        batches.append(len(session_ids))
        return devices_mark_online(session_ids=session_ids)

    writer = BatchWriter("online", write)
    await asyncio.gather(*(writer.submit(session) for _, session in rows))
    assert batches == [20]
    online = await database_sync_to_async(
        lambda: list(Device.objects.filter(is_online=True).values_list("pk", flat=True)))()
    assert sorted(online) == sorted(device.pk for device, _ in rows)


async def test_a_late_online_write_does_not_revive_a_closed_session() -> None:
    [(device, session)] = await database_sync_to_async(claimed)(1)
    [(other, other_session)] = await database_sync_to_async(claimed)(1)
    await database_sync_to_async(device_mark_offline)(device_id=device.pk, session_id=session)
    await asyncio.gather(online_writer().submit(session), online_writer().submit(other_session))
    states: dict[int, Any] = await database_sync_to_async(
        lambda: dict(Device.objects.values_list("pk", "is_online")))()
    assert states == {device.pk: False, other.pk: True}
