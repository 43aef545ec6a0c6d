"""Provider chains: every attempt is logged (kind, outcome, time) and every wait is bounded
(first item, and the gap between items after it). Pure, on the virtual-time loop, so a
10-second stall takes no real time and the measured times are exact."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from conversations.capture import AttemptLog
from conversations.pipeline import fallback
from conversations.pipeline.fallback import (
    AllProvidersFailed,
    ProviderBroke,
    ProviderChain,
    ProviderStalled,
    Slot,
)
from conversations.providers.base import LLMDelta, PCMChunk, ProviderError
from testing.fake_providers import (
    FailingASR,
    FakeEchoASR,
    FakeEchoLLM,
    FakeToneTTS,
    HangingLLM,
)

pytestmark = pytest.mark.virtual_time


class SlowStartLLM:
    """Answers after `delay` seconds, then streams `pieces`, pausing `gaps[i]` before piece i+1."""

    name = "slow"

    def __init__(self, delay: float = 0.0, pieces: tuple[str, ...] = ("Hello", " there."),
                 gaps: tuple[float, ...] = ()) -> None:
        self.delay, self.pieces, self.gaps = delay, pieces, gaps

    async def stream(self, messages: list[dict], **_: Any) -> AsyncIterator[LLMDelta]:
        await asyncio.sleep(self.delay)
        for number, piece in enumerate(self.pieces):
            if number and number - 1 < len(self.gaps):
                await asyncio.sleep(self.gaps[number - 1])
            yield LLMDelta(text=piece)


class BreakingTTS:
    name = "breaking"

    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        yield PCMChunk(b"\x00\x00" * 240, 24000)
        raise ConnectionResetError("peer went away")


def chain(stage: str, *slots: tuple[str, Any, float]) -> ProviderChain:
    return ProviderChain(stage, [Slot(kind, provider, timeout) for kind, provider, timeout in slots])


async def drain(stream: AsyncIterator[Any]) -> list[Any]:
    return [item async for item in stream]


async def test_asr_attempts_record_the_failure_and_the_provider_that_served() -> None:
    log = AttemptLog()
    asr = chain("asr", ("fail", FailingASR(delay=0.25), 5.0), ("fake_echo", FakeEchoASR(text="hi"), 5.0))
    assert await fallback.transcribe(asr, b"\x00" * 320, 16000, "en", log) == ("hi", "fake_echo")
    assert log.as_json() == {"asr": [
        {"kind": "fail", "ok": False, "error": "ProviderError", "ms": 250.0},
        {"kind": "fake_echo", "ok": True, "ms": 0.0},
    ]}


async def test_the_llms_first_token_wait_is_capped_by_the_caller() -> None:
    log = AttemptLog()
    llm = chain("llm", ("hang", HangingLLM(), 30.0), ("fake_echo", FakeEchoLLM(reply="Hi."), 30.0))
    started = asyncio.get_running_loop().time()
    kind, deltas = await fallback.stream_llm(llm, [], attempts=log, first_wait=1.5, tools=None, model="m",
                                             temperature=0.5, max_tokens=10)
    assert kind == "fake_echo" and asyncio.get_running_loop().time() - started == pytest.approx(1.5)
    assert "".join(d.text for d in await drain(deltas)) == "Hi."
    assert [(a["kind"], a["ok"], a.get("error"), a["ms"]) for a in log.as_json()["llm"]] == [
        ("hang", False, "TimeoutError", 1500.0), ("fake_echo", True, None, 0.0)]


async def test_without_a_cap_the_slots_own_timeout_bounds_the_first_token() -> None:
    llm = chain("llm", ("slow", SlowStartLLM(delay=2.0), 3.0))
    kind, deltas = await fallback.stream_llm(llm, [], tools=None, model="m", temperature=0.5, max_tokens=10)
    assert kind == "slow" and len(await drain(deltas)) == 2
    with pytest.raises(AllProvidersFailed):
        await fallback.stream_llm(llm, [], first_wait=1.0, tools=None, model="m", temperature=0.5, max_tokens=10)


async def test_an_llm_that_goes_quiet_after_its_first_token_stalls_after_the_gap() -> None:
    log = AttemptLog()
    llm = chain("llm", ("slow", SlowStartLLM(delay=0.5, pieces=("Hello", " there"), gaps=(60.0,)), 30.0))
    _, deltas = await fallback.stream_llm(llm, [], attempts=log, gap=4.0, tools=None, model="m",
                                             temperature=0.5, max_tokens=10)
    got: list[str] = []
    started = asyncio.get_running_loop().time()
    with pytest.raises(ProviderStalled) as stalled:
        async for delta in deltas:
            got.append(delta.text)
    assert got == ["Hello"] and asyncio.get_running_loop().time() - started == pytest.approx(4.0)
    assert isinstance(stalled.value.__cause__, TimeoutError)
    # One call, one entry: the success at the first token became the failure.
    assert log.as_json() == {"llm": [{"kind": "slow", "ok": False, "error": "ProviderStalled", "ms": 4500.0}]}
    assert llm.order()[0].failed_until > 0  # tried last for a while, should the persona have another


async def test_a_slow_but_steady_llm_is_never_cut() -> None:
    llm = chain("llm", ("slow", SlowStartLLM(pieces=("a", "b", "c", "d"), gaps=(3.0, 3.0, 3.0)), 30.0))
    _, deltas = await fallback.stream_llm(llm, [], gap=4.0, tools=None, model="m", temperature=0.5, max_tokens=10)
    assert [d.text for d in await drain(deltas)] == ["a", "b", "c", "d"]


async def test_without_a_gap_an_llm_may_pause_as_long_as_it_likes() -> None:
    llm = chain("llm", ("slow", SlowStartLLM(pieces=("a", "b"), gaps=(500.0,)), 30.0))
    _, deltas = await fallback.stream_llm(llm, [], tools=None, model="m", temperature=0.5, max_tokens=10)
    assert len(await drain(deltas)) == 2


async def test_tts_successes_collapse_while_failures_all_count() -> None:
    log = AttemptLog()
    tts = chain("tts", ("fail_first", _FailOnce(), 5.0), ("fake_tone", FakeToneTTS(duration_ms=60), 5.0))
    for sentence in ("One.", "Two.", "Three."):
        _, chunks = await fallback.synthesize(tts, sentence, voice="", language="en", attempts=log)
        await drain(chunks)
    kinds = [(a["kind"], a["ok"]) for a in log.as_json()["tts"]]
    # Sentence one: the first provider failed, the tone served; then the failed one was tried
    # last (cooldown) and the tone served two more sentences: one entry for them all.
    assert kinds == [("fail_first", False), ("fake_tone", True)]


async def test_a_tts_stream_that_breaks_mid_sentence_is_logged_as_failed() -> None:
    log = AttemptLog()
    tts = chain("tts", ("breaking", BreakingTTS(), 5.0))
    _, chunks = await fallback.synthesize(tts, "Hello.", voice="", language="en", attempts=log)
    with pytest.raises(ProviderBroke):
        await drain(chunks)
    assert log.as_json() == {"tts": [{"kind": "breaking", "ok": False, "error": "ConnectionResetError", "ms": 0.0}]}


class _FailOnce:
    name = "fail_first"

    def __init__(self) -> None:
        self.calls = 0

    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        self.calls += 1
        if self.calls == 1:
            raise ProviderError("first call fails")
        yield PCMChunk(b"\x00\x00" * 240, 24000)
