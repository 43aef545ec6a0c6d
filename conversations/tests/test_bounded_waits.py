"""Bounded waits in a device turn (issue 11 item 10): a model that goes quiet after its first
token ends in the apology after the inter-token bound, a hung one gives way to the next
after the first-token bound, and a long wait (first words, a tool) gets one spoken filler.
The real session and engine on the virtual-time loop: the bounds are exact, and waiting
30 seconds costs nothing."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from conversations.pipeline import phrases
from conversations.pipeline.states import SessionState
from conversations.tests.fakes import listen
from conversations.tests.test_engine import assert_spoken_block, make_persona
from conversations.tests.voice_rig import MakeRig, capture_rigs
from devices.protocol.messages import Llm, Stt, TtsSentenceStart, TtsStop
from tools.registry import ToolSpec

pytestmark = pytest.mark.virtual_time

@pytest.fixture
async def rig() -> AsyncIterator[MakeRig]:
    async with capture_rigs() as make:
        yield make


ANSWER = "😊 Sure, the light is on now. Anything else?"
ONE_MOMENT = phrases.filler("en")


class TimedTool:
    """A server tool that answers after `seconds`."""

    kind = "server"
    origin = ""
    timeout = 30.0

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def list_tools(self) -> list[ToolSpec]:
        return [ToolSpec("lookup", "Looks something up.", {"type": "object"}, "server")]

    async def call(self, name: str, arguments: dict) -> str:
        await asyncio.sleep(self.seconds)
        return "found it"


def subtitles(r: Any) -> list[str]:
    return [m.text for m in r.transport.decoded() if isinstance(m, TtsSentenceStart)]


def spoken_kinds(r: Any) -> list[str]:
    """The wire from `tts start` on, without the `llm` (emotion) frame."""
    kinds = r.transport.kinds()
    return [k for k in kinds[kinds.index("TtsStart"):] if k != "Llm"]


def sent_at(r: Any, kind: type) -> float:
    return next(s.at for s in r.transport.sent if isinstance(s.message, kind))


async def one_turn(r: Any, text: str = "turn on the kitchen light") -> None:
    await r.session.feed_text(listen("start", mode="auto"))
    await r.say_words(text)
    await r.wait_for(lambda: r.transport.count(TtsStop) == 1, timeout=60)
    await r.wait_for(lambda: len(r.hooks.turns) == 1)


async def test_a_model_that_stalls_after_its_first_token_ends_in_the_apology_within_the_bound(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {"reply": ANSWER, "chunk_chars": 12, "stall_after": 3}},
                  llm_inter_token_timeout=3.0)
    await one_turn(r)
    # "😊 Sure, the light is on now. Anythin" came, then nothing: the whole sentences are said,
    # the unfinished one dropped, and the apology follows once the model was silent for 3 s.
    assert subtitles(r) == ["Sure,", "the light is on now.", phrases.apology("en")]
    apology_at = next(s.at for s in r.transport.sent
                      if isinstance(s.message, TtsSentenceStart) and s.message.text == phrases.apology("en"))
    assert 3.0 <= apology_at - sent_at(r, Stt) < 3.5
    assert_spoken_block(spoken_kinds(r))
    turn = r.hooks.turns[0]
    assert turn.error.startswith("llm:") and "stalled" in turn.error
    assert turn.reply_text.endswith(phrases.apology("en"))
    assert [(a["kind"], a["ok"], a.get("error")) for a in turn.provider_attempts["llm"]] == [
        ("fake_echo", False, "ProviderStalled")]
    assert turn.provider_attempts["llm"][0]["ms"] == pytest.approx(3000, abs=50)
    assert r.session.state is SessionState.LISTENING


async def test_a_hung_model_gives_way_to_the_next_after_the_first_token_bound(rig: Any) -> None:
    r = await rig(make_persona(llm=("hang", "fake_echo")), providers={"llm.fake_echo": {"reply": ANSWER}},
                  llm_first_token_timeout=4.0)
    await one_turn(r)
    turn = r.hooks.turns[0]
    assert turn.error == "" and turn.providers["llm"] == "fake_echo"
    assert [(a["kind"], a["ok"]) for a in turn.provider_attempts["llm"]] == [("hang", False), ("fake_echo", True)]
    assert turn.provider_attempts["llm"][0] == {"kind": "hang", "ok": False, "error": "TimeoutError", "ms": 4000.0}
    # The user waited more than two seconds: one filler first, then the answer.
    assert subtitles(r) == [ONE_MOMENT, "Sure,", "the light is on now.", "Anything else?"]
    assert sent_at(r, TtsSentenceStart) - sent_at(r, Stt) == pytest.approx(2.0, abs=0.1)
    assert 2000 <= turn.timings["filler"] - turn.timings["asr_done"] < 2100  # ms


async def test_an_answer_in_time_gets_no_filler(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {"reply": ANSWER, "first_token_delay": 1.8}})
    await one_turn(r)
    assert subtitles(r) == ["Sure,", "the light is on now.", "Anything else?"]
    assert "filler" not in r.hooks.turns[0].timings
    await asyncio.sleep(3)  # no timer left behind that could still speak
    assert subtitles(r) == ["Sure,", "the light is on now.", "Anything else?"]


async def test_a_slow_tool_gets_a_filler_that_keeps_the_wire_sequence(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {"reply": ANSWER, "tool_calls": [{"name": "lookup"}]}})
    await r.session.toolset.add_source(TimedTool(3.0))
    await one_turn(r)
    assert subtitles(r) == [ONE_MOMENT, "Sure,", "the light is on now.", "Anything else?"]
    assert_spoken_block(spoken_kinds(r))  # tts start, whole sentences (the filler one of them), tts stop
    assert r.hooks.turns[0].tool_calls[0]["success"] is True


async def test_the_filler_is_said_once_per_turn_however_long_the_waits(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {"reply": ANSWER, "tool_calls": [{"name": "lookup"}],
                                               "first_token_delay": 3.0}})
    await r.session.toolset.add_source(TimedTool(3.0))
    await one_turn(r)  # 3 s to the tool call, 3 s of tool, 3 s to the answer: three long waits
    assert subtitles(r).count(ONE_MOMENT) == 1
    assert subtitles(r)[0] == ONE_MOMENT


async def test_the_filler_speaks_the_personas_language(rig: Any) -> None:
    r = await rig(make_persona(language="zh"),
                  providers={"llm.fake_echo": {"reply": "好的。", "first_token_delay": 2.5}})
    await one_turn(r)
    assert subtitles(r) == ["请稍等。", "好的。"]


async def test_the_filler_can_be_switched_off(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {"reply": ANSWER, "first_token_delay": 5.0}}, filler_after=0)
    await one_turn(r)
    assert subtitles(r) == ["Sure,", "the light is on now.", "Anything else?"]


async def test_a_stall_before_any_whole_sentence_is_just_the_apology(rig: Any) -> None:
    r = await rig(providers={"llm.fake_echo": {"reply": ANSWER, "chunk_chars": 6, "stall_after": 1}},
                  llm_inter_token_timeout=2.0)
    await one_turn(r)
    assert subtitles(r) == [phrases.apology("en")]
    assert r.hooks.turns[0].reply_text == phrases.apology("en")
    assert next(m for m in r.transport.decoded() if isinstance(m, Llm)).emotion == "happy"


def test_the_review_waterfall_shows_when_the_filler_was_said() -> None:
    from conversations.review import timing_rows

    rows = timing_rows({"speech_end": 0.0, "asr_done": 300.0, "filler": 2300.0, "llm_first_token": 4100.0})
    assert [row.label for row in rows] == ["End of speech", "Speech recognised", "Filler said (a long wait)",
                                           "First LLM token"]
    assert [row.delta_ms for row in rows] == [0.0, 300.0, 2000.0, 1800.0]
