"""Admission against the real server: past capacity a new device's socket is accepted and closed
with 1013 and the reason by daphne's gate (xiaozhi_site/ws_fastpath.py), before any consumer is
made, while the device already admitted keeps talking."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from channels.db import database_sync_to_async
from websockets.exceptions import ConnectionClosed

from devices.protocol.close_codes import CloseCode
from devices.services import device_token_issue
from devices.tests.factories import BoundDeviceFactory
from simulator.device import SimulatedDevice
from simulator.events import DeviceError

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


async def _device(server: Any) -> SimulatedDevice:
    owned = await database_sync_to_async(BoundDeviceFactory)()
    token = await database_sync_to_async(device_token_issue)(device=owned)
    sim = SimulatedDevice(server.http_url, mac=owned.mac, client_id=owned.client_id)
    await sim.connect(url=f"{server.ws_url}/xiaozhi/v1/", token=token)
    return sim


async def test_past_capacity_daphne_refuses_a_new_device_with_1013_and_the_admitted_one_keeps_talking(
        asgi_server_factory: Any) -> None:
    # Admission is per process: one worker, whatever mode the suite runs in.
    server = asgi_server_factory(XIAOZHI_MAX_STREAMING_SESSIONS="1", XIAOZHI_WORKERS="1")
    admitted = await _device(server)
    refused: list[SimulatedDevice] = []
    try:
        assert (await admitted.hello())["type"] == "hello"
        for _ in range(2):  # the admitted one holds its place while it arrives (5 s)
            refused.append(await _device(server))
            closed = await refused[-1].wait_closed(timeout=10)
            assert (closed.payload["code"], closed.payload["reason"]) == (
                CloseCode.TRY_AGAIN_LATER, "server busy: streaming capacity reached")
        hostile = await _device(server)  # talks on past its refusal: the frames go nowhere
        refused.append(hostile)
        with contextlib.suppress(DeviceError, ConnectionClosed, OSError):  # closed, or reset, while it sends
            for _ in range(20):
                await hostile.send_raw_text("{not json")
                await hostile.send_raw_bytes(b"\xff" * 4096)
        await hostile.wait_closed(timeout=10)
        assert (await admitted.hello())["type"] == "hello"  # its session is untouched
    finally:
        await asyncio.gather(admitted.close(), *(sim.close() for sim in refused))


async def test_while_the_hearing_is_late_new_connections_wait_unaccepted_and_still_get_in(
        asgi_server_factory: Any) -> None:
    # Any lag at all is late here: once the streaming device's hearing reports, the worker
    # leaves new connections in its listening socket's queue, at most MAX_HOLD_SECONDS, then
    # takes a trickle, so the next device still connects.
    server = asgi_server_factory(XIAOZHI_ADMISSION_HOLD_LAG_MS="0.001", XIAOZHI_WORKERS="1")
    talking = await _device(server)
    later: SimulatedDevice | None = None
    try:
        assert (await talking.hello())["type"] == "hello"
        await talking.listen_start("auto")
        streaming = asyncio.ensure_future(talking.send_silence(600))
        # The next device comes once the hearing has reported late: its first batch may come
        # after the silence on a slow machine (Silero loads with the first window).
        await _logged(server, "new connections held: the hearing is late")
        later = await _device(server)
        assert (await later.hello())["type"] == "hello"
        await streaming
        assert "pacing new connections on 1 listening port(s)" in server.log()  # daphne's own port was found
        assert (await talking.hello())["type"] == "hello"
    finally:
        await asyncio.gather(talking.close(), *([later.close()] if later else []))


async def _logged(server: Any, line: str, timeout: float = 15.0) -> None:
    """Wait until the server's log holds `line`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while line not in server.log():
        assert asyncio.get_running_loop().time() < deadline, f"not logged within {timeout:g} s: {line}"
        await asyncio.sleep(0.05)
