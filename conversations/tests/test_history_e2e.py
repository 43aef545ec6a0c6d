"""Turn history under concurrency, through the real server (issue 11, items 3 and 12).

On SQLite (the embedded default) a deferred transaction that reads first cannot upgrade to a
write while another connection writes, and fails at once with "database is locked" instead
of waiting for the busy timeout: turns were lost when devices talked at the same time, and
an OTA check-in racing a disconnect got a 500. The same tests run on PostgreSQL in the
integration tier.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from conversations.models import Conversation, Turn
from conversations.tests.e2e import session_recorded_closed
from conversations.tests.factories import PersonaFactory
from devices.tests.factories import BoundDeviceFactory, mac_for
from simulator.device import SimulatedDevice
from testing.server import AsgiServer, database_url
from testing.speech import silence

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DEVICES = 8
TURNS = 5
FAKE = {"asr_providers": ["fake_echo"], "llm_providers": ["fake_echo"], "tts_providers": ["fake_tone"]}


@pytest.fixture(scope="module")
def server(django_db_setup: Any, django_db_blocker: Any) -> Iterator[AsgiServer]:
    from django.db import connection

    with django_db_blocker.unblock():
        url = database_url(connection.settings_dict)
    env = {"DATABASE_URL": url, "XIAOZHI_WS_AUTH": "open", "XIAOZHI_PROVIDER_PLUGINS": "testing.fake_providers"}
    with AsgiServer(env=env) as running:
        yield running


def _devices(count: int, first: int) -> list[str]:
    persona = PersonaFactory(**FAKE)
    macs = [mac_for(first + n) for n in range(count)]
    for mac in macs:
        BoundDeviceFactory(mac=mac, persona=persona)
    return macs


async def _talk(server: AsgiServer, mac: str, turns: int) -> SimulatedDevice:
    device = SimulatedDevice(server.http_url, mac=mac, listen_mode="manual", features={})
    await device.connect(f"{server.ws_url}/xiaozhi/v1/", token="")
    await device.hello()
    for _ in range(turns):
        await device.listen_start()
        await device.send_audio(silence(16000, 180), realtime=False)
        await device.listen_stop()
        await device.wait_for_tts_stop(timeout=30)
    return device


async def test_every_turn_of_devices_talking_at_once_is_stored(server: AsgiServer) -> None:
    macs = await database_sync_to_async(_devices)(DEVICES, 0xD50000)
    devices = await asyncio.gather(*(_talk(server, mac, TURNS) for mac in macs))
    session_ids = [device.session_id for device in devices]
    await asyncio.gather(*(device.close() for device in devices))
    await asyncio.gather(*(session_recorded_closed(sid) for sid in session_ids))
    stored = Turn.objects.filter(conversation__session_id__in=session_ids)
    assert await database_sync_to_async(stored.count)() == DEVICES * TURNS
    ended = Conversation.objects.filter(session_id__in=session_ids, ended_at__isnull=False)
    assert await database_sync_to_async(ended.count)() == DEVICES


async def test_an_ota_check_in_racing_disconnects_succeeds(server: AsgiServer) -> None:
    macs = await database_sync_to_async(_devices)(DEVICES, 0xD51000)
    talkers = await asyncio.gather(*(_talk(server, mac, 1) for mac in macs))
    session_ids = [device.session_id for device in talkers]
    checkers = [SimulatedDevice(server.http_url, mac=mac) for mac in macs]
    # Every device drops its socket (the server writes its turn, presence and the
    # conversation's end) while each one checks in again at the same moment.
    results = await asyncio.gather(
        *(device.close() for device in talkers), *(checker.ota_check() for checker in checkers),
        return_exceptions=True,
    )
    await asyncio.gather(*(session_recorded_closed(sid) for sid in session_ids))
    failures = [r for r in results if isinstance(r, BaseException)]
    assert failures == []
    assert all("websocket" in reply for reply in results[DEVICES:])
