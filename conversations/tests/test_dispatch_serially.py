"""`dispatch_serially`: the device consumer's dispatch loop keeps Channels' guarantees (one
handler at a time, each source in order, a stop ends it all) with one reader task per source."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from channels.exceptions import StopConsumer

from conversations.consumers import dispatch_serially


def source(queue: asyncio.Queue[dict[str, Any]]) -> Any:
    return queue.get


async def test_handlers_run_one_at_a_time_and_each_source_in_order() -> None:
    socket: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    layer: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    seen: list[str] = []
    running = 0

    async def dispatch(message: dict[str, Any]) -> None:
        nonlocal running
        running += 1
        assert running == 1, "two handlers ran at once"
        await asyncio.sleep(0.001 if message["type"] == "slow" else 0)
        seen.append(message["name"])
        running -= 1
        if message["name"] == "bye":
            raise StopConsumer

    for i in range(5):
        socket.put_nowait({"type": "slow" if i % 2 else "fast", "name": f"s{i}"})
        layer.put_nowait({"type": "slow", "name": f"l{i}"})
    serving = asyncio.ensure_future(dispatch_serially([source(socket), source(layer)], dispatch))
    await asyncio.sleep(0.05)
    socket.put_nowait({"type": "fast", "name": "bye"})
    with pytest.raises(StopConsumer):
        await asyncio.wait_for(serving, 2)
    assert [n for n in seen if n.startswith("s")] == [f"s{i}" for i in range(5)]
    assert [n for n in seen if n.startswith("l")] == [f"l{i}" for i in range(5)]
    assert seen[-1] == "bye"


async def test_nothing_is_dispatched_after_a_handler_stops_and_the_other_reader_is_cancelled() -> None:
    socket: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    layer: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    seen: list[str] = []
    gets = 0

    async def layer_receive() -> dict[str, Any]:
        nonlocal gets
        gets += 1
        return await layer.get()

    async def dispatch(message: dict[str, Any]) -> None:
        seen.append(message["name"])
        if message["name"] == "disconnect":
            layer.put_nowait({"name": "late command"})  # ready while the stop unwinds
            raise StopConsumer

    socket.put_nowait({"name": "disconnect"})
    with pytest.raises(StopConsumer):
        await asyncio.wait_for(dispatch_serially([source(socket), layer_receive], dispatch), 2)
    assert seen == ["disconnect"]
    assert gets >= 1


async def test_a_handlers_error_propagates() -> None:
    socket: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def dispatch(message: dict[str, Any]) -> None:
        raise ValueError(message["name"])

    socket.put_nowait({"name": "boom"})
    with pytest.raises(ValueError, match="boom"):
        await asyncio.wait_for(dispatch_serially([source(socket)], dispatch), 2)
