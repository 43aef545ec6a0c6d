"""The benchmarks' load generator (bench/loadgen.py) against a real WebSocket server."""
from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from websockets.asyncio.server import ServerConnection, serve

# Imported as the benchmark scripts import it (bench/ on the path), so it is one module.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from loadgen import LightDevice, Microphones


@contextlib.asynccontextmanager
async def refused_device() -> AsyncIterator[LightDevice]:
    """A device whose server closes the socket at once with 1013, once the close arrived."""
    async def refuse(connection: ServerConnection) -> None:
        await connection.close(1013, "server full")

    async with serve(refuse, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        device = LightDevice(f"ws://127.0.0.1:{port}/xiaozhi/v1/", "02:00:00:00:00:01", mcp=False)
        await device.connect()
        async with asyncio.timeout(10):  # a guard only: `closed` is set as the close frame arrives
            await device.closed.wait()
        yield device


async def test_a_device_refused_with_a_close_frame_records_the_code_and_reason() -> None:
    async with refused_device() as device:
        assert (device.close_code, device.close_reason) == (1013, "server full")
        assert device.errors == []


async def test_the_microphones_send_each_devices_packets_in_order_on_its_clock_until_the_end() -> None:
    received: dict[str, list[tuple[float, bytes]]] = {}

    async def record(connection: ServerConnection) -> None:
        heard = received.setdefault(connection.request.headers["Device-Id"], [])
        async for message in connection:  # the server unmasks: the frames are well formed
            heard.append((asyncio.get_running_loop().time(), message))

    packets = [bytes([n]) * size for n, size in enumerate((3, 125, 126, 300))]  # the three length encodings
    async with serve(record, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        devices = [LightDevice(f"ws://127.0.0.1:{port}/xiaozhi/v1/", f"02:00:00:00:00:0{i}", mcp=False)
                   for i in (1, 2)]
        for device in devices:
            await device.connect()
        mics, loop = Microphones(), asyncio.get_running_loop()
        start = loop.time() + 0.05
        sent = await asyncio.gather(mics.start(devices[0], packets, start, start + 0.5).done,
                                    mics.start(devices[1], packets, start + 0.03, start + 0.25, offset=2).done)
        await mics.aclose()
        await asyncio.sleep(0.1)
        for device in devices:
            await device.close()
    assert sent == [9, 4] and [d.sent for d in devices] == sent  # 500 ms and 220 ms of 60 ms frames
    first = [message for _at, message in received["02:00:00:00:00:01"]]
    second = [message for _at, message in received["02:00:00:00:00:02"]]
    assert first == [packets[n % 4] for n in range(9)] and second == [packets[(2 + n) % 4] for n in range(4)]
    last_heard = received["02:00:00:00:00:01"][-1][0]
    assert last_heard >= start + 8 * 0.06  # on the clock (never early), not sent in one burst


async def test_a_microphone_stops_when_its_device_is_gone() -> None:
    async with refused_device() as device:
        mics = Microphones()
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(10):  # a guard only: the stream ends at its first frame
            assert await mics.start(device, [b"\x01"], loop.time(), loop.time() + 60).done == 0
        await mics.aclose()


async def test_a_turns_speech_then_its_held_silence_until_stopped_as_talk_sends_them() -> None:
    heard: list[bytes] = []

    async def record(connection: ServerConnection) -> None:
        async for message in connection:
            heard.append(bytes(message))

    speech, silence = [b"s1" * 40, b"s2" * 40, b"s3" * 40], [b"t1", b"t2"]
    async with serve(record, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        device = LightDevice(f"ws://127.0.0.1:{port}/xiaozhi/v1/", "02:00:00:00:00:01", mcp=False)
        await device.connect()
        loop = asyncio.get_running_loop()
        start = loop.time()
        last_speech = await device.stream(speech, start)
        assert last_speech >= start + 2 * 0.06  # the third packet's time on the clock
        stop = asyncio.Event()
        mic = asyncio.create_task(device.stream_until(silence, start + 3 * 0.06, stop))
        await asyncio.sleep(0.5)
        stop.set()
        sent = await mic
        await asyncio.sleep(0.1)
        await device.close()
    assert sent >= 4 and device.sent == 3 + sent
    assert heard == speech + silence + [silence[-1]] * (sent - 2)  # then the last again, no wrap
