"""Hearing's streaming figures: per-packet lag (arrival → decode + VAD done), logged at close."""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from conversations.pipeline.cpu_pool import CpuMill
from conversations.pipeline.listen import Hearing, LagHistogram, VADSettings
from conversations.providers import registry
from testing.speech import opus_packets, silence, speak


@pytest.fixture(scope="module")
def executor() -> Any:
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


def test_the_lag_histogram_gives_bucket_upper_edges_and_the_max() -> None:
    lag = LagHistogram()
    for ms in [0.2] * 98 + [5.5, 70.3]:
        lag.add(ms / 1000)
    assert lag.percentile(0.5) == 1.0
    assert lag.percentile(0.99) == 6.0
    assert lag.percentile(1.0) == 71.0
    assert lag.max_ms == pytest.approx(70.3)
    assert LagHistogram().percentile(0.99) == 0.0


async def test_every_heard_packet_gets_a_lag_and_the_figures_are_logged_at_close(
    executor: Any, caplog: pytest.LogCaptureFixture
) -> None:
    hearing = Hearing(mill=CpuMill.for_executor(executor), vad=registry.shared("vad", "silero"),
                      settings=VADSettings(), on_event=lambda _e: None)
    hearing.start(endpointing=True)
    packets = opus_packets(silence(16000, 300) + speak("hello there") + silence(16000, 300))
    for packet in packets:
        hearing.push(packet)
        await asyncio.sleep(0.005)
    for _ in range(500):
        if hearing.packets == len(packets) and sum(hearing.lag.counts.values()) == len(packets):
            break
        await asyncio.sleep(0.01)
    assert sum(hearing.lag.counts.values()) == hearing.packets == len(packets)
    assert 0.0 <= hearing.lag.max_ms < 5000
    with caplog.at_level(logging.INFO, logger="conversations.pipeline.listen"):
        await hearing.aclose()
    [record] = [r for r in caplog.records if r.getMessage() == "hearing stats"]
    assert record.packets == len(packets) and record.dropped == 0  # type: ignore[attr-defined]
    assert sum(record.lag_histogram_ms.values()) == len(packets)  # type: ignore[attr-defined]
