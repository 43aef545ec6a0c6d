"""The benchmarks' load generator (bench/loadgen.py) against a real WebSocket server."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from websockets.asyncio.server import ServerConnection, serve

# Imported as the benchmark scripts import it (bench/ on the path), so it is one module.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from loadgen import LightDevice


async def test_a_device_refused_with_a_close_frame_records_the_code_and_reason() -> None:
    async def refuse(connection: ServerConnection) -> None:
        await connection.close(1013, "server full")

    async with serve(refuse, "127.0.0.1", 0) as server:
        port = server.sockets[0].getsockname()[1]
        device = LightDevice(f"ws://127.0.0.1:{port}/xiaozhi/v1/", "02:00:00:00:00:01", mcp=False)
        await device.connect()
        async with asyncio.timeout(10):  # a guard only: `closed` is set as the close frame arrives
            await device.closed.wait()
    assert (device.close_code, device.close_reason) == (1013, "server full")
    assert device.errors == []
