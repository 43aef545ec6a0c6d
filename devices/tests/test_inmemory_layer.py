"""The in-process channel layer (one worker without Redis) sweeps expired messages at most
once per interval instead of on every receive, and still expires them."""
from __future__ import annotations

import asyncio

import pytest
from channels.layers import InMemoryChannelLayer as BaseInMemoryChannelLayer

from devices.layers import InMemoryChannelLayer


async def test_many_receives_within_the_interval_sweep_once(monkeypatch: pytest.MonkeyPatch) -> None:
    sweeps: list[int] = []
    real = BaseInMemoryChannelLayer._clean_expired

    def counting(self: BaseInMemoryChannelLayer) -> None:
        sweeps.append(len(self.channels))
        real(self)

    monkeypatch.setattr(BaseInMemoryChannelLayer, "_clean_expired", counting)
    layer = InMemoryChannelLayer()
    waiting = [asyncio.create_task(layer.receive(await layer.new_channel())) for _ in range(200)]
    await asyncio.sleep(0)
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    assert len(sweeps) == 1


async def test_an_expired_message_is_still_dropped() -> None:
    layer = InMemoryChannelLayer(expiry=0.05)
    layer.CLEAN_INTERVAL_SECONDS = 0.05
    stale = await layer.new_channel()
    await layer.send(stale, {"type": "device.command"})
    await asyncio.sleep(0.12)
    fresh = await layer.new_channel()
    await layer.send(fresh, {"type": "device.command"})
    assert await layer.receive(fresh) == {"type": "device.command"}  # this receive swept
    assert stale not in layer.channels


async def test_messages_are_delivered_as_before() -> None:
    layer = InMemoryChannelLayer()
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "a"})
    await layer.send(channel, {"type": "b"})
    assert [await layer.receive(channel) for _ in range(2)] == [{"type": "a"}, {"type": "b"}]
