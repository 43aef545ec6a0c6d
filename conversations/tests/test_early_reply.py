"""Early replies (pipeline/early.py): the LLM asked before the turn is certain, with the real
Thinker and tool loop. Nothing reaches the turn or the tools before `join`; a cancelled
reply never runs a tool; an LLM failure is the joining turn's to handle."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from conversations.pipeline.aio import TaskSet
from conversations.pipeline.early import EarlyReply
from conversations.pipeline.think import Thinker
from conversations.providers.base import ProviderError
from conversations.tests.test_think import chain, make_thinker
from testing.fake_providers import FailingLLM, FakeEchoLLM


class Waits:
    """The filler's view of the user's waits."""

    def __init__(self) -> None:
        self.signals: list[str] = []

    def waiting(self) -> None:
        self.signals.append("waiting")

    def answered(self) -> None:
        self.signals.append("answered")


def early(thinker: Thinker, llm: Any, text: str, tasks: TaskSet) -> EarlyReply:
    llm_chain = chain(llm)
    return EarlyReply(text, lambda thought, on_text, watcher, before_tools: thinker.think(
        llm_chain, text, thought, on_text, watcher=watcher, before_tools=before_tools), tasks.create)


async def settle() -> None:
    for _ in range(20):  # let the early reply's task run as far as it can
        await asyncio.sleep(0)


async def test_the_text_waits_for_the_turn_and_then_arrives_whole_and_in_order() -> None:
    tasks = TaskSet("test")
    llm = FakeEchoLLM(reply="😊 Sure, the light is on now.", chunk_chars=4)
    reply = early(await make_thinker(), llm, "turn on the light", tasks)
    await settle()
    assert len(llm.requests) == 1 and llm.requests[0][-1] == {"role": "user", "content": "turn on the light"}
    parts: list[str] = []

    async def on_text(delta: str) -> None:
        parts.append(delta)

    await reply.join(on_text, Waits())
    assert "".join(parts) == "😊 Sure, the light is on now."
    assert reply.thought.reply_text == "😊 Sure, the light is on now."
    assert reply.thought.first_token_at is not None and reply.thought.providers == ["fake_echo"]
    await tasks.aclose()


async def test_text_streaming_while_the_held_text_is_passed_on_keeps_its_order() -> None:
    tasks = TaskSet("test")
    llm = FakeEchoLLM(reply="one two three four five six", chunk_chars=4, first_token_delay=0.01)
    reply = early(await make_thinker(), llm, "count", tasks)
    await asyncio.sleep(0.02)  # some text is held, the rest still streaming
    parts: list[str] = []

    async def slow_on_text(delta: str) -> None:
        await asyncio.sleep(0)  # the LLM task runs between deltas
        parts.append(delta)

    await reply.join(slow_on_text, Waits())
    assert "".join(parts) == "one two three four five six"
    await tasks.aclose()


async def test_a_tool_call_waits_for_the_turn() -> None:
    tasks = TaskSet("test")
    thinker = await make_thinker()
    llm = FakeEchoLLM(reply="It is noon.", tool_calls=[{"name": "get_current_time", "arguments": {}}])
    reply = early(thinker, llm, "what time is it", tasks)
    await settle()
    assert len(llm.requests) == 1 and reply.thought.tool_calls == []  # asked for the tool, holds it

    async def on_text(delta: str) -> None:
        pass

    await reply.join(on_text, Waits())
    assert [r.name for r in reply.thought.tool_calls] == ["get_current_time"]
    assert len(llm.requests) == 2 and reply.thought.reply_text == "It is noon."
    await tasks.aclose()


async def test_a_cancelled_reply_never_runs_its_tool_and_stops_asking() -> None:
    tasks = TaskSet("test")
    llm = FakeEchoLLM(reply="It is noon.", tool_calls=[{"name": "get_current_time", "arguments": {}}])
    reply = early(await make_thinker(), llm, "what time is it", tasks)
    await settle()
    reply.cancel()
    await settle()
    assert len(tasks) == 0  # its task has ended
    assert reply.thought.tool_calls == [] and len(llm.requests) == 1


async def test_the_llms_failure_is_raised_to_the_turn_and_not_logged_as_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = TaskSet("test")
    reply = early(await make_thinker(), FailingLLM(), "hello", tasks)
    await settle()

    async def on_text(delta: str) -> None:
        pass

    with caplog.at_level(logging.ERROR), pytest.raises(ProviderError):
        await reply.join(on_text, Waits())
    assert "background task failed" not in caplog.text
    assert reply.thought.attempts.as_json()["llm"][0]["ok"] is False


async def test_the_users_wait_is_reported_from_the_turn_on() -> None:
    tasks = TaskSet("test")
    llm = FakeEchoLLM(reply="Hi.", first_token_delay=0.05)
    reply = early(await make_thinker(), llm, "hello", tasks)
    await settle()  # the round started: the model is being waited for, but not by the user yet
    waits = Waits()

    async def on_text(delta: str) -> None:
        pass

    await reply.join(on_text, waits)
    assert waits.signals == ["waiting", "answered"]  # the filler's timer starts at the join

    answered_early = early(await make_thinker(), FakeEchoLLM(reply="Hi."), "hello", tasks)
    await settle()  # answered before the turn ended: nobody waited
    later = Waits()
    await answered_early.join(on_text, later)
    assert later.signals == []
    await tasks.aclose()
