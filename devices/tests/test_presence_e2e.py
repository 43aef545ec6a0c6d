"""Presence after a mass disconnect: every device returns to offline, end to end.

Hundreds of simulated devices hold sockets on the real server; the database is made busy
(a writer holds its lock for longer than a session waits for its own writes) and then
every socket drops at once. The offline marks must still all land.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connection, transaction

from devices.models import Device
from devices.services import device_token_issue
from simulator.device import SimulatedDevice
from devices.tests.factories import BoundDeviceFactory, UserFactory
from testing.server import AsgiServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DEVICES = 200  # the reported case had 2,000 (a bench figure); this is enough to overflow the pool
HOLD_SECONDS = 7.0  # longer than a session's 5 s wait for its own writes
CONNECTING_AT_ONCE = 25


def _fleet() -> list[tuple[Device, str]]:
    owner = UserFactory()
    devices = BoundDeviceFactory.create_batch(DEVICES, owner=owner)
    return [(device, device_token_issue(device=device)) for device in devices]


async def _online(sim: SimulatedDevice, url: str, token: str, gate: asyncio.Semaphore) -> None:
    async with gate:
        await sim.connect(url=url, token=token)
        await sim.hello()


async def _count(**filters: Any) -> int:
    return await database_sync_to_async(Device.objects.filter(**filters).count)()


async def _wait_until_count(expected: int, timeout: float, **filters: Any) -> int:
    deadline = time.monotonic() + timeout
    while (found := await _count(**filters)) != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return found


def _hold_the_write_lock(pks: list[int], held: threading.Event) -> None:
    """A long write transaction on the device rows (SQLite: the database lock; PostgreSQL:
    the rows' locks), so the server's offline writes wait behind it."""
    try:
        with transaction.atomic():
            Device.objects.filter(pk__in=pks).update(location="busy")
            held.set()
            time.sleep(HOLD_SECONDS)
    finally:
        connection.close()


async def test_a_mass_disconnect_leaves_no_device_online(asgi_server: AsgiServer) -> None:
    fleet = await database_sync_to_async(_fleet)()
    url = f"{asgi_server.ws_url}/xiaozhi/v1/"
    sims = [SimulatedDevice(asgi_server.http_url, mac=device.mac, client_id=device.client_id, features={})
            for device, _ in fleet]
    gate = asyncio.Semaphore(CONNECTING_AT_ONCE)
    try:
        await asyncio.gather(*(_online(sim, url, token, gate) for sim, (_, token) in zip(sims, fleet, strict=True)))
        assert await _wait_until_count(DEVICES, 60, is_online=True) == DEVICES

        held = threading.Event()
        holder = threading.Thread(target=_hold_the_write_lock, args=([d.pk for d, _ in fleet], held))
        holder.start()
        assert await asyncio.to_thread(held.wait, 10)
        await asyncio.gather(*(sim.close() for sim in sims))  # every socket drops at once
        await asyncio.to_thread(holder.join)

        still_online = await _wait_until_count(0, 60, is_online=True)
        assert still_online == 0, f"{still_online} of {DEVICES} devices still marked online"
        assert await _count(channel_name="") == DEVICES
    finally:
        await asyncio.gather(*(sim.close() for sim in sims), return_exceptions=True)
