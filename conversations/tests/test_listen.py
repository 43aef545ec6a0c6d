"""Hearing: real Opus decoding and real Silero VAD on espeak speech, no fakes."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from conversations.pipeline import endpointing, listen
from conversations.pipeline.cpu_pool import CpuMill
from conversations.pipeline.listen import (
    BYTES_PER_MS,
    PREROLL_MS,
    Hearing,
    HearingEvent,
    SpeechPaused,
    SpeechStarted,
    SpeechStopped,
    VADSettings,
)
from conversations.providers import registry
from conversations.providers.vad.silero import SileroVAD
from testing.speech import opus_packets, silence, speak


@pytest.fixture(scope="module")
def executor() -> Any:
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


class Ears:
    def __init__(self, executor: Any, min_silence_ms: float = 400.0, **kw: Any) -> None:
        self.events: list[HearingEvent] = []
        self.hearing = Hearing(
            mill=CpuMill.for_executor(executor), vad=registry.shared("vad", "silero"),
            settings=VADSettings(0.5, 0.3, min_silence_ms), on_event=self.events.append, **kw,
        )

    async def feed(self, pcm: bytes) -> None:
        packets = opus_packets(pcm)
        for packet in packets:
            while len(self.hearing._queue) > 20:  # a device sends one packet per 60 ms
                await asyncio.sleep(0.001)
            self.hearing.push(packet)
        await self.drained()
        assert self.hearing.dropped == 0

    async def drained(self) -> None:
        for _ in range(2000):
            if self.hearing.idle:
                await asyncio.sleep(0.01)
                if self.hearing.idle:
                    return
            await asyncio.sleep(0.002)
        raise AssertionError("hearing did not drain")

    def kinds(self) -> list[str]:
        return [type(e).__name__ for e in self.events]

    def utterances(self) -> list[bytes]:
        return [e.utterance.pcm for e in self.events if isinstance(e, SpeechStopped)]


def rms(pcm: bytes) -> float:
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0


async def test_it_finds_an_utterance_and_keeps_the_first_syllable(executor: Any) -> None:
    ears = Ears(executor)
    speech = speak("turn on the kitchen light")
    ears.hearing.start(endpointing=True)
    await ears.feed(silence(16000, 1000) + speech + silence(16000, 1000))
    assert ears.kinds()[0] == "SpeechStarted" and ears.kinds()[-1] == "SpeechStopped"
    assert ears.kinds().count("SpeechStopped") == 1
    [utterance] = ears.utterances()
    assert len(utterance) >= len(speech) + 400 * BYTES_PER_MS
    assert len(utterance) <= len(speech) + (PREROLL_MS + 1000) * BYTES_PER_MS
    assert rms(utterance[: 200 * BYTES_PER_MS]) < 50  # starts in the silence before the voice
    await ears.hearing.aclose()


async def test_a_pause_is_reported_and_speech_resuming_cancels_it(executor: Any) -> None:
    ears = Ears(executor, min_silence_ms=700)
    ears.hearing.start(endpointing=True)
    pcm = silence(16000, 500) + speak("one two three") + silence(16000, 450) + speak("four five")
    await ears.feed(pcm + silence(16000, 1200))
    kinds = ears.kinds()
    assert kinds[0] == "SpeechStarted"
    assert "SpeechPaused" in kinds and "SpeechResumed" in kinds
    assert kinds.index("SpeechPaused") < kinds.index("SpeechResumed") < kinds.index("SpeechStopped")
    assert kinds.count("SpeechStopped") == 1
    last_pause = [e for e in ears.events if isinstance(e, SpeechPaused)][-1]
    assert len(last_pause.utterance.pcm) > len(speak("one two three"))  # both halves in it
    await ears.hearing.aclose()


async def test_manual_mode_hands_over_everything_at_listen_stop(executor: Any) -> None:
    ears = Ears(executor)
    ears.hearing.start(endpointing=False)
    pcm = speak("turn on the kitchen light") + silence(16000, 1500)
    await ears.feed(pcm)
    assert ears.events == []  # no endpointing in manual mode
    ears.hearing.finish_manual()
    await ears.drained()
    [utterance] = ears.utterances()
    assert len(utterance) == len(opus_packets(pcm)) * 960 * 2
    await ears.hearing.aclose()


async def test_a_full_queue_drops_and_counts_packets(executor: Any) -> None:
    blocker = threading.Event()
    slow_pool = ThreadPoolExecutor(1)
    slow_pool.submit(blocker.wait)
    ears = Ears(slow_pool, queue_packets=5)
    ears.hearing.start(endpointing=True)
    for packet in opus_packets(silence(16000, 1200)):  # 20 packets, no await in between
        ears.hearing.push(packet)
    assert ears.hearing.dropped == 15
    blocker.set()
    await ears.hearing.aclose()
    slow_pool.shutdown()


async def test_audio_is_ignored_while_muted_or_not_listening(executor: Any) -> None:
    ears = Ears(executor)
    packets = opus_packets(silence(16000, 600))
    for packet in packets:
        ears.hearing.push(packet)  # before any listen start
    ears.hearing.start(endpointing=True)
    ears.hearing.mute(10.0)
    for packet in packets:
        ears.hearing.push(packet)
    assert ears.hearing.ignored == 2 * len(packets)
    assert ears.hearing.packets == 0
    await ears.hearing.aclose()


async def test_invalid_packets_are_counted_and_hearing_goes_on(executor: Any) -> None:
    ears = Ears(executor)
    ears.hearing.start(endpointing=True)
    ears.hearing.push(b"\x0b\xff\xff")  # libopus: "corrupted stream"
    await ears.feed(silence(16000, 500) + speak("hello there") + silence(16000, 800))
    assert ears.hearing.invalid == 1
    assert len(ears.utterances()) == 1
    await ears.hearing.aclose()


async def test_listen_start_forgets_audio_from_before(executor: Any) -> None:
    ears = Ears(executor)
    ears.hearing.start(endpointing=True)
    await ears.feed(silence(16000, 300) + speak("turn on the kitchen"))  # cut off mid-utterance
    ears.hearing.start(endpointing=True)
    await ears.feed(silence(16000, 900))
    assert "SpeechStopped" not in ears.kinds()  # the old half-utterance never completes
    await ears.hearing.aclose()


async def test_a_monologue_is_cut_at_the_utterance_limit(executor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(endpointing, "MAX_UTTERANCE_MS", 1500)
    ears = Ears(executor)
    ears.hearing.start(endpointing=True)
    await ears.feed(silence(16000, 300) + speak("this is a long monologue without any pause at all"))
    stops = ears.utterances()
    # checked once per batch, so the cut may overshoot by up to one batch
    assert stops and len(stops[0]) <= (1500 + listen.MAX_BATCH * 60) * BYTES_PER_MS
    assert isinstance(ears.events[0], SpeechStarted)
    await ears.hearing.aclose()



def test_batched_vad_matches_each_stream_alone_window_for_window() -> None:
    clips = [speak("turn on the kitchen light") + silence(16000, 300), silence(16000, 200) + speak("hello there")]
    chunk = 1920  # one 60 ms packet
    vad = SileroVAD()
    vad.SILENCE_PEAK = 0.0  # compare the model itself, without the silence gate
    expected = []
    for clip in clips:
        alone = vad.stream()
        expected.append([p for i in range(0, len(clip), chunk) for p in alone.probabilities(clip[i : i + chunk])])
    streams = [vad.stream(), vad.stream()]
    got: list[list[float]] = [[], []]
    for i in range(0, max(len(c) for c in clips), chunk):  # both sessions in the same runs
        work = [(s, c[i : i + chunk]) for s, c in zip(streams, clips, strict=True)]
        for out, probs in zip(got, vad.probabilities(work), strict=True):
            out.extend(probs)
    for want, have in zip(expected, got, strict=True):
        assert len(have) == len(want)
        assert np.allclose(have, want, atol=1e-4)
