"""Downlink pacing of SpeechStream on a virtual clock (protocol-reference §8, product P5).

The virtual clock jumps to each deadline the pacer sleeps until, so send times are exact and
the tests are deterministic; one test checks the real loop clock with tolerances.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from conversations.pipeline.fallback import ProviderChain, Slot
from conversations.pipeline.reply import ReplyHandle
from conversations.pipeline.speak import FRAME_S, MAX_LEAD_FRAMES, STOP_MARGIN_S, SpeechStream
from conversations.providers.base import PCMChunk
from devices.protocol.messages import Message
from devices.protocol.opus import OpusDecoder
from testing.fake_providers import FailingTTS, FakeToneTTS, HangingTTS, tone

START = 1000.0


class VirtualClock:
    def __init__(self) -> None:
        self.t = START

    def now(self) -> float:
        return self.t

    async def sleep_until(self, deadline: float) -> None:
        self.t = max(self.t, deadline)
        await asyncio.sleep(0)


class Wire:
    """What the pacer sent, with virtual send times."""

    def __init__(self, clock: VirtualClock | None) -> None:
        self.clock = clock
        self.events: list[tuple[float, str, Any]] = []

    def _now(self) -> float:
        return self.clock.now() if self.clock else asyncio.get_running_loop().time()

    async def send(self, message: Message) -> None:
        self.events.append((self._now(), type(message).__name__, getattr(message, "text", None)))

    async def send_audio(self, packet: bytes) -> None:
        self.events.append((self._now(), "audio", packet))

    def frame_times(self) -> list[float]:
        return [at for at, kind, _ in self.events if kind == "audio"]

    def kinds(self) -> list[str]:
        out: list[str] = []
        for _, kind, _ in self.events:
            if not (kind == "audio" and out and out[-1] == "audio"):
                out.append(kind)
        return out


@pytest.fixture(scope="module")
def executor() -> Any:
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown()


def chain(*providers: Any) -> ProviderChain:
    return ProviderChain("tts", [Slot(p.name, p, 5.0) for p in providers])


def stream(executor: Any, wire: Wire, clock: VirtualClock | None, tts: ProviderChain, **kw: Any) -> SpeechStream:
    return SpeechStream(
        tts=tts, executor=executor, send=wire.send, send_audio=wire.send_audio, sample_rate=24000,
        voice="", language="en", clock=clock, **kw,
    )


def assert_lead_within_limit(times: list[float], anchor: float) -> None:
    for index, at in enumerate(times):
        played = (at - anchor) / FRAME_S  # frames whose playout has finished by now
        assert index + 1 - played <= MAX_LEAD_FRAMES + 1e-9, (index, at - anchor)


async def test_frames_follow_the_playout_clock_at_most_three_ahead(executor: Any) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    speech = stream(executor, wire, clock, chain(FakeToneTTS(duration_ms=1000)))
    speech.push("One second of tone.")
    speech.end_input()
    await speech.wait_for_playout()
    times = wire.frame_times()
    assert len(times) == 17  # 1000 ms in 60 ms frames, the last one padded
    anchor = times[0]
    assert times[:3] == [anchor] * 3  # the device starts with a small cushion...
    for n, at in enumerate(times[3:], start=3):  # ...then one frame per 60 ms
        assert at == pytest.approx(anchor + (n - 2) * FRAME_S)
    assert_lead_within_limit(times, anchor)
    assert clock.now() == pytest.approx(anchor + 17 * FRAME_S + STOP_MARGIN_S)  # tts stop is due


async def test_the_first_frame_waits_a_few_ms_after_tts_start(executor: Any) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    speech = stream(executor, wire, clock, chain(FakeToneTTS(duration_ms=200)), not_before=START + 0.005)
    speech.push("Hi.")
    speech.end_input()
    await speech.wait_for_playout()
    assert wire.frame_times()[0] == pytest.approx(START + 0.005)


async def test_subtitles_bracket_their_own_frames_in_order(executor: Any) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    speech = stream(executor, wire, clock, chain(FakeToneTTS(duration_ms=500)))
    speech.push("First sentence.")
    speech.push("**Second** one 😊")
    speech.end_input()
    await speech.wait_for_playout()
    assert wire.kinds() == [
        "TtsSentenceStart", "audio", "TtsSentenceEnd", "TtsSentenceStart", "audio", "TtsSentenceEnd"
    ]
    texts = [text for _, kind, text in wire.events if kind == "TtsSentenceStart"]
    assert texts == ["First sentence.", "Second one"]
    second_start = next(at for at, kind, text in wire.events if text == "Second one")
    first_frame_of_second = wire.frame_times()[9]  # 500 ms = 9 frames per sentence
    assert second_start == first_frame_of_second  # the subtitle goes out with its audio
    times = wire.frame_times()
    assert_lead_within_limit(times, times[0])  # one clock across sentences, no burst


async def test_it_re_anchors_after_an_underrun_instead_of_bursting(executor: Any) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    speech = stream(executor, wire, clock, chain(FakeToneTTS(duration_ms=300)))
    speech.push("Before the gap.")
    while speech.stats.frames < 5:
        await asyncio.sleep(0.001)
    clock.t += 2.0  # the next sentence arrives long after the device ran dry
    resumed_at = clock.t
    speech.push("After the gap.")
    speech.end_input()
    await speech.wait_for_playout()
    times = wire.frame_times()[5:]
    assert times[:3] == [resumed_at] * 3
    assert times[3] == pytest.approx(resumed_at + FRAME_S)
    assert speech.stats.underruns == 1
    assert_lead_within_limit(times, resumed_at)
    assert clock.now() == pytest.approx(resumed_at + 5 * FRAME_S + STOP_MARGIN_S)


async def test_an_interrupted_reply_sends_nothing_more(executor: Any) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    reply = ReplyHandle(1)

    async def send_audio(packet: bytes) -> None:
        await wire.send_audio(packet)
        if len(wire.frame_times()) == 4:
            reply.interrupt("abort")

    speech = SpeechStream(
        tts=chain(FakeToneTTS(duration_ms=2000)), executor=executor, send=reply.guard_send(wire.send),
        send_audio=reply.guard_audio(send_audio), sample_rate=24000, voice="", language="en", clock=clock,
    )
    speech.push("A long sentence.")
    speech.push("Another one.")
    speech.end_input()
    await asyncio.sleep(0.05)
    await speech.aclose()
    assert len(wire.frame_times()) == 4
    assert wire.kinds() == ["TtsSentenceStart", "audio"]


async def test_aclose_stops_a_stream_stuck_in_tts(executor: Any) -> None:
    wire = Wire(None)
    speech = stream(executor, wire, None, chain(HangingTTS()))
    speech.push("Never spoken.")
    speech.end_input()
    await asyncio.sleep(0.01)
    await asyncio.wait_for(speech.aclose(), 1.0)
    assert wire.events == []


async def test_a_failing_tts_is_replaced_for_the_sentence(executor: Any) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    speech = stream(executor, wire, clock, chain(FailingTTS(), FakeToneTTS(duration_ms=120)))
    speech.push("Hello there.")
    speech.end_input()
    await speech.wait_for_playout()
    assert speech.stats.providers == ["fake_tone"]
    assert len(wire.frame_times()) == 2


async def test_a_sentence_no_provider_can_speak_is_skipped_without_subtitle(executor: Any) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    speech = stream(executor, wire, clock, chain(FailingTTS()))
    speech.push("Hello there.")
    speech.end_input()
    await speech.wait_for_playout()
    assert wire.events == [] and speech.stats.failed_sentences == 1


class ChunkedTTS:
    """22.05 kHz speech-like tone in odd-sized chunks, like a streaming cloud TTS."""

    name = "chunked"

    async def synthesize(self, text: str, *, voice: str, language: str) -> Any:
        pcm = tone(1000, 22050)
        for start in range(0, len(pcm), 3002):
            yield PCMChunk(pcm[start : start + 3002], 22050)


async def test_audio_is_resampled_and_cut_into_decodable_60_ms_frames(executor: Any) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    speech = stream(executor, wire, clock, chain(ChunkedTTS()))
    speech.push("Resample me.")
    speech.end_input()
    await speech.wait_for_playout()
    packets = [p for _, kind, p in wire.events if kind == "audio"]
    assert len(packets) == 17
    decoder = OpusDecoder(24000)
    assert all(len(decoder.decode(p)) == 1440 * 2 for p in packets)


class CountingPool(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(1)
        self.jobs = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.jobs += 1
        return super().submit(*args, **kwargs)


async def test_a_replys_first_frames_are_encoded_in_the_first_words_pool_and_the_rest_in_the_other() -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    first, rest = CountingPool(), CountingPool()
    try:
        speech = stream(rest, wire, clock, chain(ChunkedTTS()), first_words=first)
        speech.push("Resample me.")
        speech.push("And me.")
        speech.end_input()
        await speech.wait_for_playout()
    finally:
        first.shutdown()
        rest.shutdown()
    assert first.jobs == 1  # the reply's first slice only, never another sentence's or chunk's
    assert rest.jobs > 10
    packets = [p for _, kind, p in wire.events if kind == "audio"]
    assert len(packets) == 34  # both sentences whole, in order
    decoder = OpusDecoder(24000)
    assert all(len(decoder.decode(p)) == 1440 * 2 for p in packets)


class GatedPool(CountingPool):
    """Its jobs wait for `gate` (a first-words pool that is slow to answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        def gated() -> Any:
            self.gate.wait(10)
            return fn(*args, **kwargs)

        return super().submit(gated)


async def test_audio_at_the_downlink_rate_has_its_first_frame_sent_before_the_pool_answers(executor: Any) -> None:
    """24 kHz audio (no resampling): the reply's first frame is encoded on the loop and sent
    while the first-words pool still holds the rest of the first slice."""
    clock = VirtualClock()
    wire = Wire(clock)
    first = GatedPool()
    try:
        speech = stream(executor, wire, clock, chain(FakeToneTTS(duration_ms=1000)), first_words=first)
        speech.push("Hello there.")
        speech.end_input()
        for _ in range(200):
            if wire.frame_times():
                break
            await asyncio.sleep(0.005)
        assert len(wire.frame_times()) == 1 and first.jobs == 1  # the pool's job is still waiting
        first.gate.set()
        await speech.wait_for_playout()
    finally:
        first.gate.set()
        first.shutdown()
    packets = [p for _, kind, p in wire.events if kind == "audio"]
    assert len(packets) == 17 and first.jobs == 1  # 1,000 ms: 17 frames, the last one padded
    decoder = OpusDecoder(24000)
    assert all(len(decoder.decode(p)) == 1440 * 2 for p in packets)
    assert wire.kinds() == ["TtsSentenceStart", "audio", "TtsSentenceEnd"]


@pytest.mark.parametrize("complexity", [0, 5, 10])
async def test_replies_are_encoded_at_the_configured_complexity(executor: Any, complexity: int) -> None:
    clock = VirtualClock()
    wire = Wire(clock)
    speech = stream(executor, wire, clock, chain(ChunkedTTS()), complexity=complexity)
    speech.push("Resample me.")
    speech.end_input()
    await speech.wait_for_playout()
    assert speech._encoder._get_encoder()._encoder.complexity == complexity  # as libopus reports it
    packets = [p for _, kind, p in wire.events if kind == "audio"]
    decoder = OpusDecoder(24000)
    assert len(packets) == 17 and all(len(decoder.decode(p)) == 1440 * 2 for p in packets)


async def test_real_time_pacing_on_the_loop_clock(executor: Any) -> None:
    """Real time is inherent here: tolerances cover scheduler jitter only."""
    wire = Wire(None)
    speech = stream(executor, wire, None, chain(FakeToneTTS(duration_ms=600)))
    speech.push("Ten frames.")
    speech.end_input()
    await speech.wait_for_playout()
    finished = asyncio.get_running_loop().time()
    times = wire.frame_times()
    anchor = times[0]
    for n, at in enumerate(times):
        due = anchor + max(0, n - 2) * FRAME_S
        assert due - 0.001 <= at <= due + 0.025, (n, at - due)
    assert finished >= anchor + len(times) * FRAME_S + STOP_MARGIN_S - 0.001
