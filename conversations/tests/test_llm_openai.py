"""OpenAILLM against the fake cloud over real HTTP."""
from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall, ChoiceDeltaToolCallFunction

from conversations.pipeline.fallback import build_chain
from conversations.providers.asr.openai_compat import OpenAIASR
from conversations.providers.base import LLM, LLMDelta, ProviderError
from conversations.providers.llm.openai_compat import Endpoint, OpenAILLM, _clients, _ToolCallAssembler
from conversations.providers.registry import build
from testing.fake_openai import Call, FakeOpenAI, Reply

USER = [{"role": "user", "content": "北京天气怎么样？"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def llm(fake: FakeOpenAI) -> AsyncIterator[OpenAILLM]:
    provider = OpenAILLM(fake.base_url, timeout=5)
    yield provider


async def _collect(llm: OpenAILLM, tools: list[dict] | None = TOOLS, **options: object) -> list[LLMDelta]:
    params = {"model": "m", "temperature": 0.5, "max_tokens": 100, **options}
    return [delta async for delta in llm.stream(USER, tools=tools, **params)]  # type: ignore[arg-type]


def _text(deltas: list[LLMDelta]) -> str:
    return "".join(d.text for d in deltas)


async def test_it_is_built_from_the_registry_and_meets_the_contract(fake: FakeOpenAI) -> None:
    provider = build("llm", "openai", base_url=fake.base_url, api_key="k", unknown_option=1)
    assert isinstance(provider, OpenAILLM) and isinstance(provider, LLM)
    assert provider.name == "openai"


async def test_it_streams_text_deltas(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(chunks=["北京", "今天", "晴。"]))
    deltas = await _collect(llm)
    assert [d.text for d in deltas] == ["北京", "今天", "晴。"]
    assert all(d.tool_calls is None for d in deltas)


async def test_it_sends_the_request_options(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    await _collect(llm, model="qwen-plus", temperature=0.2, max_tokens=64)
    [request] = fake.chat_requests
    assert request.messages == USER and request.tools == TOOLS
    assert (request.model, request.temperature, request.max_tokens) == ("qwen-plus", 0.2, 64)
    assert request.body["stream"] is True


async def test_it_leaves_out_an_empty_tool_list(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    await _collect(llm, tools=[])
    assert "tools" not in fake.chat_requests[0].body


async def test_it_assembles_a_tool_call_split_across_chunks(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(tool_calls=[Call("get_weather", {"city": "北京", "days": 3}, id="call_abc")]))
    deltas = await _collect(llm)
    [call] = deltas[-1].tool_calls or []
    assert (call.id, call.name) == ("call_abc", "get_weather")
    assert json.loads(call.arguments) == {"city": "北京", "days": 3}


async def test_it_assembles_two_parallel_tool_calls_in_order(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(tool_calls=[Call("get_weather", {"city": "北京"}), Call("set_volume", {"volume": 30})]))
    deltas = await _collect(llm)
    calls = deltas[-1].tool_calls or []
    assert [c.name for c in calls] == ["get_weather", "set_volume"]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "北京"}, {"volume": 30}]
    assert len({c.id for c in calls}) == 2


async def test_tool_calls_come_only_on_the_last_delta_after_the_text(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(text="我查一下。", tool_calls=[Call("get_weather")]))
    deltas = await _collect(llm)
    assert _text(deltas) == "我查一下。"
    assert [d.tool_calls is not None for d in deltas] == [False] * (len(deltas) - 1) + [True]
    assert deltas[-1].text == "" and deltas[-1].tool_calls[0].arguments == "{}"


async def test_the_first_delta_waits_for_the_first_token(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(text="慢慢来。", first_token_delay=0.3))
    started = time.monotonic()
    stream = llm.stream(USER, tools=None, model="m", temperature=0.5, max_tokens=100)
    first = await anext(stream)
    assert first.text and time.monotonic() - started >= 0.28
    await stream.aclose()


@pytest.mark.parametrize("status", [500, 429])
async def test_an_error_status_becomes_a_provider_error(fake: FakeOpenAI, llm: OpenAILLM, status: int) -> None:
    fake.script(Reply(status=status, error="upstream unhappy"))
    with pytest.raises(ProviderError, match=str(status)):
        await _collect(llm)
    assert len(fake.chat_requests) == 1  # no retries: the pipeline falls back instead


async def test_a_hanging_server_fails_quickly_with_a_short_timeout(fake: FakeOpenAI) -> None:
    fake.script(Reply(hang=True))
    llm = OpenAILLM(fake.base_url, timeout=0.3)
    started = time.monotonic()
    with pytest.raises(ProviderError, match="Timeout"):
        await _collect(llm)
    assert time.monotonic() - started < 2


async def test_a_stream_that_stalls_midway_times_out(fake: FakeOpenAI) -> None:
    fake.script(Reply(text="one two three", stall_after=2))
    llm = OpenAILLM(fake.base_url, timeout=0.3)
    received: list[str] = []
    with pytest.raises(ProviderError):
        async for delta in llm.stream(USER, tools=None, model="m", temperature=0.5, max_tokens=100):
            received.append(delta.text)
    assert received == ["one "]


async def test_a_dropped_stream_becomes_a_provider_error(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(text="one two three four", drop_after=3))
    with pytest.raises(ProviderError):
        await _collect(llm)


async def test_a_stream_without_finish_reason_is_an_error(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(text="cut short", finish_reason=None))  # [DONE] but never said why
    with pytest.raises(ProviderError, match="before the model finished"):
        await _collect(llm)


async def test_a_reply_cut_by_max_tokens_is_still_delivered(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(text="half an ans", finish_reason="length"))
    assert _text(await _collect(llm)) == "half an ans"


async def test_an_unreachable_server_becomes_a_provider_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connection refused
        llm = OpenAILLM(f"http://127.0.0.1:{port}/v1/", timeout=2)
        with pytest.raises(ProviderError, match="Connection"):
            await _collect(llm)


async def test_errors_never_carry_the_api_key(fake: FakeOpenAI) -> None:
    fake.api_key = "sk-right-000000"
    fake.script(Reply(status=500, error="bad key sk-live-1234567890 and Bearer abc.def"))
    llm = OpenAILLM(fake.base_url, api_key="sk-live-1234567890", timeout=2)
    with pytest.raises(ProviderError) as caught:
        await _collect(llm)
    assert "1234567890" not in str(caught.value) and "abc.def" not in str(caught.value)


async def test_closing_the_stream_early_leaves_the_provider_usable(fake: FakeOpenAI, llm: OpenAILLM) -> None:
    fake.script(Reply(text="a long answer that gets interrupted", chunk_delay=0.05), Reply(text="next."))
    stream = llm.stream(USER, tools=None, model="m", temperature=0.5, max_tokens=100)
    await anext(stream)
    await stream.aclose()  # the user barged in
    assert _text(await _collect(llm)) == "next."


def _fragment(
    index: int | None, id: str | None = None, name: str | None = None, args: str | None = None
) -> ChoiceDeltaToolCall:
    function = ChoiceDeltaToolCallFunction(name=name, arguments=args)
    return ChoiceDeltaToolCall.model_construct(index=index, id=id, function=function, type="function")


def test_the_assembler_starts_a_new_call_when_a_server_reuses_index_zero() -> None:
    assembler = _ToolCallAssembler()
    assembler.add([_fragment(0, "a", "first", '{"x"'), _fragment(0, args=": 1}")])
    assembler.add([_fragment(0, "b", "second", "{}")])
    calls = assembler.result()
    assert [(c.id, c.name, c.arguments) for c in calls] == [("a", "first", '{"x": 1}'), ("b", "second", "{}")]


def test_the_assembler_handles_fragments_without_index_and_id() -> None:
    assembler = _ToolCallAssembler()
    assembler.add([_fragment(None, None, "lookup", '{"q":'), _fragment(None, args=' "tea"}')])
    assembler.add([_fragment(None, args=None)])
    [call] = assembler.result()
    assert call.name == "lookup" and json.loads(call.arguments) == {"q": "tea"} and call.id.startswith("call_")


# -- one SDK client per endpoint and event loop ------------------------------------------------


async def test_providers_of_one_endpoint_share_one_client_on_a_loop(fake: FakeOpenAI) -> None:
    """Every talking session builds its providers; the ~17 ms and ~0.85 MB of a client (its
    TLS context) and the pooled connections are the process's, once per endpoint."""
    first, second = OpenAILLM(fake.base_url, api_key="k", timeout=5), OpenAILLM(fake.base_url, api_key="k", timeout=5)
    asr = OpenAIASR(fake.base_url, api_key="k", timeout=5)
    assert first._endpoint.client() is second._endpoint.client() is asr._endpoint.client()
    other_key = OpenAILLM(fake.base_url, api_key="k2", timeout=5)
    other_timeout = OpenAILLM(fake.base_url, api_key="k", timeout=6)
    clients = {id(p._endpoint.client()) for p in (first, other_key, other_timeout)}
    assert len(clients) == 3
    assert "k2" not in repr(other_key._endpoint)  # the key stays out of logs and tracebacks


async def test_another_event_loop_gets_its_own_client_and_a_closed_loops_clients_are_dropped(fake: FakeOpenAI) -> None:
    """httpx binds a pool to the loop that uses it: a one-off `asyncio.run` (a probe, a Celery
    task) must not hand its client to the server's loop, nor keep it after it ends."""
    llm = OpenAILLM(fake.base_url, timeout=5)
    fake.script(Reply(text="from another loop."), Reply(text="from this one."))

    async def elsewhere() -> tuple[object, str]:
        return llm._endpoint.client(), _text(await _collect(llm, tools=None))

    theirs, their_text = await asyncio.to_thread(asyncio.run, elsewhere())
    assert their_text == "from another loop." and _text(await _collect(llm, tools=None)) == "from this one."
    assert llm._endpoint.client() is not theirs
    loops = list(_clients._by_loop)
    assert asyncio.get_running_loop() in loops and not any(loop.is_closed() for loop in loops)


async def test_a_session_closing_its_chain_leaves_the_shared_client_to_the_others(fake: FakeOpenAI) -> None:
    configs = {"openai": {"base_url": fake.base_url, "api_key": "k", "timeout": 5}}
    leaving, staying = build_chain("llm", ["openai"], configs), build_chain("llm", ["openai"], configs)
    fake.script(Reply(text="still here."))
    await leaving.aclose()
    provider = staying.slots[0].provider
    assert isinstance(provider, OpenAILLM)
    assert _text(await _collect(provider, tools=None)) == "still here."
    assert provider._endpoint == Endpoint(fake.base_url, "k", 5.0, 0)
