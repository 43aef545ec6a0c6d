"""Admission against the real server: past capacity a new device's socket is accepted and closed
with 1013 and the reason before any consumer is made (xiaozhi_site/ws_fastpath.py: on the
connection's first read, or by daphne's gate when the request came in pieces), while the
device already admitted keeps talking."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
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


@contextlib.asynccontextmanager
async def _full_worker(asgi_server_factory: Any) -> AsyncIterator[Any]:
    """One worker with one streaming place, taken by a device that said hello (it holds the
    place for 5 s while it arrives); afterwards that device must still be answered."""
    server = asgi_server_factory(XIAOZHI_MAX_STREAMING_SESSIONS="1", XIAOZHI_WORKERS="1")
    admitted = await _device(server)
    try:
        assert (await admitted.hello())["type"] == "hello"
        yield server
        assert (await admitted.hello())["type"] == "hello"  # its session is untouched
    finally:
        await admitted.close()


async def test_a_refused_upgrade_is_answered_on_its_first_read_and_one_in_pieces_by_daphnes_gate(
        asgi_server_factory: Any) -> None:
    async with _full_worker(asgi_server_factory) as server:
        whole, reset = await _raw_exchange(server, [_REQUEST])
        assert not reset  # a half-close: the client reads every byte, then the end
        assert whole == (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n"
                         b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n" + _CLOSE_FULL)
        pieces, _reset = await _raw_exchange(server, [_REQUEST[:40], _REQUEST[40:]])
        head, _, frames = pieces.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101 ") and b"Server: daphne" in head  # autobahn's handshake
        assert frames.startswith(_CLOSE_FULL)


async def test_a_burst_at_a_full_worker_waits_in_the_kernels_queue_and_every_device_hears_1013_in_time(
        asgi_server_factory: Any) -> None:
    # 60 at once at a full worker: taken by the line's pacing (one a tick here, ~3 s in all), each
    # answered with 1013 within the firmware's 10 s.
    async with _full_worker(asgi_server_factory) as server:
        await _logged(server, "pacing new connections on 1 listening port(s)")  # the watcher reads the line
        burst = await asyncio.wait_for(asyncio.gather(*(_raw_exchange(server, [_REQUEST]) for _ in range(60))),
                                       timeout=10)
        assert all(received.endswith(_CLOSE_FULL) for received, _reset in burst)
        assert "places full: waiting connections are refused by their deadline" in server.log()


_REQUEST = (b"GET /xiaozhi/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            b"Protocol-Version: 1\r\nDevice-Id: aa:bb:cc:dd:ee:01\r\nClient-Id: raw\r\n\r\n")
_CLOSE_FULL = b"\x88\x29\x03\xf5server busy: streaming capacity reached"


async def _raw_exchange(server: Any, writes: list[bytes]) -> tuple[bytes, bool]:
    """Send `writes` a moment apart, answer a close frame as a client does, and return all the
    server sent until it closed the connection, and whether it ended with a reset."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        for index, data in enumerate(writes):
            if index:
                await asyncio.sleep(0.2)  # the server reads the pieces apart
            writer.write(data)
            await writer.drain()
        # Read at once: autobahn's handshake (the request in pieces) resets the connection
        # when the close frame is not answered within its 1 s close handshake timeout.
        received = await asyncio.wait_for(reader.read(4096), timeout=10)
        with contextlib.suppress(ConnectionError):
            writer.write(b"\x88\x82\x00\x00\x00\x00\x03\xe8")  # masked close 1000
        try:
            while chunk := await asyncio.wait_for(reader.read(4096), timeout=10):
                received += chunk
        except ConnectionResetError:
            return received, True
        return received, False
    finally:
        writer.close()


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
