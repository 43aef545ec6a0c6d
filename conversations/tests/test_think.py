"""Thinking: the tool-call loop, the context window, the prompt, LLM fallback, emotion."""
from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any

import pytest

from conversations.pipeline.config import DeviceInfo, PersonaConfig
from conversations.pipeline.fallback import ProviderChain, Slot
from conversations.pipeline.prompt import render_system_prompt
from conversations.pipeline.think import MAX_TOOL_DEPTH, EmotionGate, Thinker, Thought
from conversations.providers.base import LLMDelta, ProviderError, ToolCall
from testing.fake_providers import FailingLLM, FakeEchoLLM, HangingLLM
from tools.builtin import BuiltinToolSource, SessionToolState
from tools.registry import Toolset

DEVICE = DeviceInfo(id=1, mac="aa:bb:cc:dd:ee:ff", name="Kitchen bot", location="Berlin", timezone="Europe/Berlin")


def chain(*providers: Any, timeout: float = 5.0) -> ProviderChain:
    return ProviderChain("llm", [Slot(getattr(p, "name", "x"), p, timeout) for p in providers])


async def make_thinker(persona: PersonaConfig | None = None, state: SessionToolState | None = None) -> Thinker:
    state = state or SessionToolState(language="en", timezone="Europe/Berlin", location="Berlin")
    toolset = Toolset([BuiltinToolSource(state)])
    await toolset.refresh()
    return Thinker(persona=persona or PersonaConfig(), device=DEVICE, toolset=toolset, model="m", tool_state=state)


async def collect(thinker: Thinker, llm: ProviderChain, text: str, parts: list[str] | None = None,
                  thought: Thought | None = None) -> tuple[str, Thought]:
    """Think, collecting the text deltas as they stream (into `parts` when given)."""
    thought = thought if thought is not None else Thought()
    parts = parts if parts is not None else []

    async def on_text(delta: str) -> None:
        parts.append(delta)

    await thinker.think(llm, text, thought, on_text)
    return "".join(parts), thought


async def test_it_runs_tool_calls_and_answers_with_their_results() -> None:
    thinker = await make_thinker()
    llm = FakeEchoLLM(reply="It is noon.", tool_calls=[{"name": "get_current_time", "arguments": {}}])
    text, thought = await collect(thinker, chain(llm), "what time is it")
    assert text == "It is noon."
    assert [r.name for r in thought.tool_calls] == ["get_current_time"] and thought.tool_calls[0].success
    second = llm.requests[1]
    assert second[-2]["tool_calls"][0]["function"]["name"] == "get_current_time"
    assert second[-1]["role"] == "tool" and '"timezone":"Europe/Berlin"' in second[-1]["content"]
    assert thought.tool_call_dicts()[0]["llm_name"] == "get_current_time"


class AlwaysTools:
    """Calls a tool whenever it may, like a model stuck in a loop."""

    name = "loop"

    def __init__(self) -> None:
        self.tool_offers: list[bool] = []

    async def stream(self, messages: list[dict], *, tools: list[dict] | None, **_: Any) -> AsyncIterator[LLMDelta]:
        self.tool_offers.append(bool(tools))
        if tools:
            yield LLMDelta(tool_calls=[ToolCall(f"c{len(self.tool_offers)}", "get_location", "{}")])
        else:
            yield LLMDelta(text="Giving up on tools.")


async def test_the_tool_loop_stops_at_the_depth_limit_with_a_forced_answer() -> None:
    thinker = await make_thinker()
    llm = AlwaysTools()
    text, thought = await collect(thinker, chain(llm), "where am I")
    assert llm.tool_offers == [True] * MAX_TOOL_DEPTH + [False]
    assert len(thought.tool_calls) == MAX_TOOL_DEPTH
    assert text == "Giving up on tools."


async def test_the_context_window_keeps_the_last_turns() -> None:
    thinker = await make_thinker(PersonaConfig(context_turns=2))
    for n in range(3):
        thinker.remember(f"question {n}", f"answer {n}")
    contents = [m["content"] for m in thinker.messages("now")[1:]]
    assert contents == ["question 1", "answer 1", "question 2", "answer 2", "now"]


async def test_no_context_is_kept_when_context_turns_is_zero() -> None:
    thinker = await make_thinker(PersonaConfig(context_turns=0))
    thinker.remember("q", "a")
    assert [m["role"] for m in thinker.messages("now")] == ["system", "user"]


def test_the_system_prompt_is_rendered_with_session_facts() -> None:
    persona = PersonaConfig(
        name="Xiao", system_prompt="I am {persona_name} in {location} on {device_name}, {current_time}, "
        "speaking {language}. JSON example: {\"a\": 1} {unknown}",
    )
    now = dt.datetime(2026, 1, 5, 12, 30, tzinfo=dt.UTC)
    text = render_system_prompt(persona, DEVICE, None, now=now, language="zh")
    assert text.startswith(
        "I am Xiao in Berlin on Kitchen bot, Monday 2026-01-05 13:30 (Europe/Berlin), speaking Chinese."
    )
    assert text.endswith('JSON example: {"a": 1} {unknown}')


def test_the_prompt_mentions_the_role_play_character() -> None:
    state = SessionToolState(characters=[{"name": "Pirate", "description": "Talks like a pirate."}], roleplay="Pirate")
    text = render_system_prompt(PersonaConfig(), DEVICE, state)
    assert "role-playing Pirate" in text and "Talks like a pirate." in text


async def test_a_language_set_by_a_tool_changes_the_prompt() -> None:
    state = SessionToolState(language="en")
    thinker = await make_thinker(PersonaConfig(system_prompt="Reply in {language}."), state)
    state.language = "de"
    assert thinker.messages("hallo")[0]["content"] == "Reply in German."


async def test_the_llm_falls_over_before_its_first_token() -> None:
    thinker = await make_thinker()
    failing, good = FailingLLM(), FakeEchoLLM(reply="Hello!")
    text, thought = await collect(thinker, chain(failing, good), "hi")
    assert text == "Hello!" and thought.providers == ["fake_echo"] and failing.calls == 1


async def test_a_hanging_llm_is_abandoned_after_its_first_token_timeout() -> None:
    thinker = await make_thinker()
    text, thought = await collect(thinker, ProviderChain("llm", [
        Slot("hang", HangingLLM(), 0.05), Slot("fake_echo", FakeEchoLLM(reply="Here."), 5.0),
    ]), "hi")
    assert text == "Here." and thought.providers == ["fake_echo"]


class BreaksMidway:
    name = "breaks"

    async def stream(self, messages: list[dict], **_: Any) -> AsyncIterator[LLMDelta]:
        yield LLMDelta(text="Half an ")
        raise ProviderError("connection reset")


async def test_after_the_first_token_a_failure_is_not_retried_elsewhere() -> None:
    thinker = await make_thinker()
    backup = FakeEchoLLM(reply="Whole answer.")
    thought = Thought()
    seen: list[str] = []
    with pytest.raises(ProviderError):
        await collect(thinker, chain(BreaksMidway(), backup), "hi", seen, thought)
    assert seen == ["Half an "] and backup.requests == []


@pytest.mark.parametrize(
    ("deltas", "emotion", "text"),
    [
        (["😊 Hello there."], "happy", "Hello there."),
        (["😊", " Hello."], "happy", "Hello."),
        (["Hello", " there."], "neutral", "Hello there."),
        (["✨😢 Oh no."], "sad", "Oh no."),
        (["🙂"], "happy", ""),
        ([], "neutral", ""),
    ],
)
def test_the_leading_emoji_becomes_the_emotion(deltas: list[str], emotion: str, text: str) -> None:
    gate = EmotionGate()
    decided: list[str] = []
    passed = ""
    for delta in deltas:
        got, rest = gate.push(delta)
        decided += [got] if got else []
        passed += rest
    got, rest = gate.flush()
    decided += [got] if got else []
    passed += rest
    assert decided == [emotion]  # exactly once per turn
    assert passed.strip() == text
