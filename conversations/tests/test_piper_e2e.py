"""A device turn answered with Piper's voice, over real sockets against the running server.

The server is the real daphne subprocess; the device is the firmware-faithful simulator; the
LLM is the scripted FakeOpenAI (the only fake). ASR is the instant `fake_echo` provider (what
the user says does not matter here); TTS is the real Piper with the bundled en_US voice. What
the device played (Opus frames decoded by the simulator's speaker) is transcribed with the real
faster-whisper tiny.en and compared with the reply text.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from conversations.providers.asr.faster_whisper import FasterWhisperASR
from conversations.tests.factories import PersonaFactory
from conversations.tests.test_voice_e2e import close_and_wait, wait_turn_row
from devices.tests.factories import BoundDeviceFactory, mac_for
from simulator.device import SimulatedDevice
from testing.fake_openai import FakeOpenAI, Reply
from testing.server import AsgiServer, database_url
from testing.speech import silence, speak, word_edits

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

_macs = iter(range(0xB1E000, 0xB1EFFF))
# tiny.en is the smallest Whisper (about 5-8 % word error rate on clean read English) and
# hears the reply after Opus at 24 kHz and a resample to 16 kHz; a slip of one or two short
# words in a reply of this length ("a" / "the", a merged compound) is the recogniser's, not
# Piper's. A wrong voice, silence, noise or espeak-ng's robotic voice read by mistake all
# score far above this, so the bound still tells Piper's speech from anything else.
MAX_WORD_ERROR_RATE = 0.25


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def server(django_db_setup: Any, django_db_blocker: Any, fake_llm: FakeOpenAI) -> Iterator[AsgiServer]:
    from django.db import connection

    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    env = {
        "DATABASE_URL": db_url, "XIAOZHI_WS_AUTH": "open", "LLM_BASE_URL": fake_llm.base_url,
        "LLM_MODEL": "fake-model", "XIAOZHI_PROVIDER_PLUGINS": "testing.fake_providers",
    }
    with AsgiServer(env=env) as running:
        yield running


@pytest.fixture(scope="module")
def whisper() -> FasterWhisperASR:
    return FasterWhisperASR()


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower().replace("’", "'"))


def word_error_rate(heard: str, expected: str) -> float:
    """Word-level edit distance over the expected word count, case and punctuation ignored."""
    ref = words(expected)
    return word_edits(ref, words(heard)) / max(1, len(ref))


def test_the_word_error_rate_counts_edits() -> None:
    assert word_error_rate("The cat, sat!", "the cat sat") == 0
    assert word_error_rate("the cat", "the cat sat") == pytest.approx(1 / 3)
    assert word_error_rate("a dog sat down", "the cat sat") == pytest.approx(3 / 3)


def _device_with(persona: dict[str, Any]) -> str:
    mac = mac_for(next(_macs))
    BoundDeviceFactory(mac=mac, persona=PersonaFactory(**persona))
    return mac


async def open_device(server: AsgiServer, **persona: Any) -> SimulatedDevice:
    defaults = {"language": "en", "voice": "", "asr_providers": ["fake_echo"], "llm_providers": ["openai"],
                "tts_providers": ["piper"], "greeting": "", "exit_phrases": []}
    mac = await database_sync_to_async(_device_with)({**defaults, **persona})
    device = SimulatedDevice(server.http_url, mac=mac, listen_mode="manual", features={"mcp": False})
    await device.connect(f"{server.ws_url}/xiaozhi/v1/", token="")
    await device.hello()
    return device


async def test_a_device_hears_pipers_voice_say_the_reply(
    server: AsgiServer, fake_llm: FakeOpenAI, whisper: FasterWhisperASR
) -> None:
    answer = "The kitchen light is on now. Is there anything else I can do for you?"
    fake_llm.script(Reply(text=answer))
    device = await open_device(server)
    try:
        await device.run_turn(silence(16000, 200) + speak("turn on the kitchen light"), timeout=60)
        assert device.subtitles[-2:] == ["The kitchen light is on now.", "Is there anything else I can do for you?"]
        pcm = device.downlink_pcm(device.tts_count)
        assert len(pcm) / 2 / device.downlink_sample_rate > 2.0
        heard = await whisper.transcribe(pcm, device.downlink_sample_rate, "en")
        assert word_error_rate(heard, answer) <= MAX_WORD_ERROR_RATE, heard
        turn = await wait_turn_row(reply_text__icontains="kitchen light")
        assert turn.providers["tts"] == "piper"
    finally:
        await close_and_wait(device)


async def test_a_chinese_persona_with_piper_first_is_spoken_by_espeak(server: AsgiServer, fake_llm: FakeOpenAI) -> None:
    fake_llm.script(Reply(text="你好，我在这里。"))
    device = await open_device(server, language="zh", tts_providers=["piper", "espeak"])
    try:
        await device.run_turn(silence(16000, 200) + speak("hello"), timeout=60)
        assert device.downlink_pcm(device.tts_count)
        turn = await wait_turn_row(reply_text__icontains="我在这里")
        assert turn.providers["tts"] == "espeak"
        assert [a["kind"] for a in turn.provider_attempts["tts"]][:2] == ["piper", "espeak"]
    finally:
        await close_and_wait(device)
