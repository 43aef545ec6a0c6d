"""The fake cloud itself, driven by the real openai client (sync and async) and raw HTTP."""
from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.request
import wave
from collections.abc import Iterator

import numpy as np
import openai
import pytest

from testing.fake_openai import Call, FakeOpenAI, RecordedRequest, Reply

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def client(fake: FakeOpenAI) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake.base_url, api_key="test-key", max_retries=0, timeout=5) as sync_client:
        yield sync_client


def _post_raw(fake: FakeOpenAI, path: str, body: dict) -> tuple[int, bytes]:
    request = urllib.request.Request(
        fake.base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_it_listens_on_loopback_with_a_v1_base_url(fake: FakeOpenAI) -> None:
    assert fake.base_url.startswith("http://127.0.0.1:")
    assert fake.base_url.endswith("/v1/")
    assert fake.port > 0


def test_it_streams_sse_chunks_ending_with_done(fake: FakeOpenAI) -> None:
    fake.script(Reply(text="Hello there."))
    status, raw = _post_raw(fake, "chat/completions", {"model": "m", "messages": USER, "stream": True})
    frames = [f for f in raw.decode().split("\n\n") if f]
    assert status == 200
    assert all(f.startswith("data: ") for f in frames)
    assert frames[-1] == "data: [DONE]"
    chunks = [json.loads(f[6:]) for f in frames[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello there."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_it_streams_text_to_the_sync_client(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(Reply(chunks=["你好", "，世界", "。"]))
    stream = client.chat.completions.create(model="m", messages=USER, stream=True)
    deltas = [c.choices[0].delta.content for c in stream if c.choices[0].delta.content]
    assert deltas == ["你好", "，世界", "。"]


def test_it_streams_tool_calls_in_fragments(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(Reply(tool_calls=[Call("get_weather", {"city": "北京"}, id="call_1")]))
    chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True))
    fragments = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert fragments[0].id == "call_1" and fragments[0].function.name == "get_weather"
    assert len(fragments) >= 3  # the arguments arrive in pieces
    assert json.loads("".join(f.function.arguments or "" for f in fragments)) == {"city": "北京"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_it_adds_a_usage_chunk_when_asked(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="m", messages=USER, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0


async def test_it_answers_non_streamed_completions_to_the_async_client(fake: FakeOpenAI) -> None:
    fake.script(Reply(text="A cat."), Reply(tool_calls=[Call("look", '{"q": 1}')]))
    async with openai.AsyncOpenAI(base_url=fake.base_url, api_key="k", max_retries=0) as client:
        text = await client.chat.completions.create(model="vision", messages=USER)
        tool = await client.chat.completions.create(model="vision", messages=USER)
    assert text.choices[0].message.content == "A cat."
    assert text.choices[0].finish_reason == "stop"
    assert tool.choices[0].message.tool_calls[0].function.arguments == '{"q": 1}'
    assert tool.choices[0].finish_reason == "tool_calls"


def test_it_records_what_the_client_sent(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    tools = [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}]
    list(client.chat.completions.create(
        model="gpt-x", messages=USER, tools=tools, temperature=0.3, max_tokens=77, stream=True
    ))  # fmt: skip
    [request] = fake.chat_requests
    assert (request.model, request.temperature, request.max_tokens) == ("gpt-x", 0.3, 77)
    assert request.messages == USER and request.tools == tools
    assert request.headers["Authorization"] == "Bearer test-key"


def test_it_answers_scripts_then_rules_then_the_default(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.default = Reply(text="default")
    fake.script(Reply(text="scripted"))
    fake.on(r"weather|天气", Reply(tool_calls=[Call("get_weather")]))
    fake.on_tool_result(Reply(text="It is sunny."))

    def ask(messages: list[dict]) -> openai.types.chat.ChatCompletion:
        return client.chat.completions.create(model="m", messages=messages)

    weather = [{"role": "user", "content": "北京天气"}]
    assert ask(weather).choices[0].message.content == "scripted"
    assert ask(weather).choices[0].message.tool_calls[0].function.name == "get_weather"
    tool_result = {"role": "tool", "tool_call_id": "1", "content": "晴"}
    after_tool = [*weather, {"role": "assistant", "tool_calls": []}, tool_result]
    assert ask(after_tool).choices[0].message.content == "It is sunny."
    assert ask(USER).choices[0].message.content == "default"


def test_a_reply_can_be_computed_from_the_request(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.default = lambda request: Reply(text=f"echo {request.last_user_text}")
    parts = [{"role": "user", "content": [{"type": "text", "text": "x"}]}]
    reply = client.chat.completions.create(model="m", messages=parts)
    assert reply.choices[0].message.content == "echo x"


@pytest.mark.parametrize(
    ("status", "error_class"),
    [(500, openai.InternalServerError), (429, openai.RateLimitError), (400, openai.BadRequestError)],
)
def test_it_fails_with_openai_style_errors(
    fake: FakeOpenAI, client: openai.OpenAI, status: int, error_class: type[Exception]
) -> None:
    fake.script(Reply(status=status, error="scripted failure"))
    with pytest.raises(error_class) as caught:
        client.chat.completions.create(model="m", messages=USER, stream=True)
    assert caught.value.body["message"] == "scripted failure"


def test_it_rejects_a_wrong_api_key(client: openai.OpenAI, fake: FakeOpenAI) -> None:
    fake.api_key = "right-key"
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="m", messages=USER)


def test_a_hanging_reply_lasts_until_the_client_times_out(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(Reply(hang=True))
    started = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        client.with_options(timeout=0.3).chat.completions.create(model="m", messages=USER)
    assert 0.25 < time.monotonic() - started < 2


def test_a_dropped_stream_breaks_the_connection(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(Reply(text="one two three four five", drop_after=3))
    received = []
    with pytest.raises(openai.APIConnectionError):
        for chunk in client.chat.completions.create(model="m", messages=USER, stream=True):
            received.append(chunk.choices[0].delta.content)
    assert received == ["", "one ", "two "]


def test_first_token_delay_holds_back_the_first_chunk(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(Reply(text="late", first_token_delay=0.3))
    started = time.monotonic()
    stream = client.chat.completions.create(model="m", messages=USER, stream=True)
    next(iter(stream))
    assert time.monotonic() - started >= 0.28
    stream.close()


def test_stop_releases_hanging_requests_quickly() -> None:
    fake = FakeOpenAI().start()
    fake.script(Reply(text="x", stall_after=1))
    client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0, timeout=5)
    stream = client.chat.completions.create(model="m", messages=USER, stream=True)
    next(iter(stream))
    started = time.monotonic()
    fake.stop()
    assert time.monotonic() - started < 2
    client.close()


def _wav_info(data: bytes) -> tuple[int, int, int]:
    with wave.open(io.BytesIO(data)) as wav:
        return wav.getframerate(), wav.getnchannels(), wav.getnframes()


def test_speech_is_real_audio_in_each_format(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    def speak(text: str, fmt: str) -> bytes:
        return client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format=fmt).content

    pcm, wav, mp3 = speak("Hello world", "pcm"), speak("Hello world", "wav"), speak("你好世界", "mp3")
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    assert len(pcm) % 2 == 0 and len(samples) > 24000 // 2  # > 0.5 s of speech
    assert np.sqrt(np.mean(samples**2)) > 300  # not silence
    assert _wav_info(wav) == (24000, 1, len(samples))
    assert mp3[:3] == b"ID3" or mp3[:2] == b"\xff\xfb"
    assert [r.body["response_format"] for r in fake.requests] == ["pcm", "wav", "mp3"]


def test_speech_failures_can_be_scripted(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script_speech(Reply(status=500))
    with pytest.raises(openai.InternalServerError):
        client.audio.speech.create(model="tts-1", voice="alloy", input="hi", response_format="pcm")
    assert client.audio.speech.create(model="tts-1", voice="alloy", input="hi", response_format="pcm").content


def test_transcriptions_come_from_the_queue_then_the_fixed_text(
    fake: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake.transcript = "fixed"
    fake.script_transcriptions(Reply(text="first"), Reply(status=429))
    audio = ("a.wav", b"RIFF-not-really", "audio/wav")
    assert client.audio.transcriptions.create(model="whisper-1", file=audio, language="zh").text == "first"
    with pytest.raises(openai.RateLimitError):
        client.audio.transcriptions.create(model="whisper-1", file=audio)
    assert client.audio.transcriptions.create(model="whisper-1", file=audio).text == "fixed"
    first: RecordedRequest = fake.requests[0]
    assert first.body == {"model": "whisper-1", "language": "zh"} and first.file == b"RIFF-not-really"


def test_unknown_paths_get_an_openai_style_404(fake: FakeOpenAI) -> None:
    status, raw = _post_raw(fake, "embeddings", {})
    assert status == 404 and "error" in json.loads(raw)


def test_reset_forgets_scripts_rules_and_requests(fake: FakeOpenAI, client: openai.OpenAI) -> None:
    fake.script(Reply(text="scripted"))
    fake.on("hi", Reply(text="rule"))
    client.models.list()
    fake.reset()
    assert fake.requests == [] and fake.rules == []
    assert client.chat.completions.create(model="m", messages=USER).choices[0].message.content == "好的。"
