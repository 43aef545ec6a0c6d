"""A device with a Chinese persona hears Chinese, over real sockets against the running server.

The server is the real daphne subprocess; the device is the firmware-faithful simulator; the
LLM is the scripted FakeOpenAI (the only fake); TTS is the real espeak-ng, started through a
tiny wrapper (ESPEAK_BINARY) that writes down each call's arguments and text before running
espeak-ng itself, so the tests can see which voice spoke which words. ASR is the instant
`fake_echo` provider: what the user says does not matter here, what the device hears does.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from conversations.pipeline.phrases import apology
from devices.models import ActivationCode, Device
from simulator.device import SimulatedDevice
from conversations.tests.factories import PersonaFactory
from devices.tests.factories import BoundDeviceFactory, DeviceFactory, mac_for
from testing.fake_openai import Call, FakeOpenAI, Reply
from testing.server import AsgiServer, database_url
from testing.speech import silence, speak

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

_macs = iter(range(0xC4E000, 0xC4EFFF))
WRAPPER = """#!/bin/sh
# Test wrapper: note the arguments and the text of each espeak-ng call, then run it.
text=$(cat)
printf '%s\\t%s\\n' "$*" "$text" >> "{log}"
printf '%s' "$text" | exec espeak-ng "$@"
"""
ZH_PERSONA = {
    "language": "zh", "voice": "zh-CN-XiaoxiaoNeural", "asr_providers": ["fake_echo"],
    "llm_providers": ["openai"], "tts_providers": ["espeak"], "greeting": "", "exit_phrases": [],
}


@pytest.fixture(scope="module")
def espeak_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("espeak")
    log = folder / "calls.log"
    wrapper = folder / "espeak-ng-logged"
    wrapper.write_text(WRAPPER.replace("{log}", str(log)), encoding="utf-8")
    wrapper.chmod(0o755)
    log.touch()
    return log


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as fake:
        yield fake


@pytest.fixture(scope="module")
def server(django_db_setup: Any, django_db_blocker: Any, fake_llm: FakeOpenAI,
           espeak_log: Path) -> Iterator[AsgiServer]:
    from django.db import connection

    with django_db_blocker.unblock():
        db_url = database_url(connection.settings_dict)
    env = {
        "DATABASE_URL": db_url, "XIAOZHI_WS_AUTH": "open", "LLM_BASE_URL": fake_llm.base_url,
        "LLM_MODEL": "fake-model", "XIAOZHI_PROVIDER_PLUGINS": "testing.fake_providers",
        "ESPEAK_BINARY": str(espeak_log.parent / "espeak-ng-logged"),
    }
    with AsgiServer(env=env) as running:
        yield running


@pytest.fixture(autouse=True)
def clean_script(fake_llm: FakeOpenAI) -> None:
    fake_llm.reset()


def spoken(log: Path, since: int) -> list[tuple[str, str]]:
    """(espeak voice, text) of each sentence synthesised since line `since` of the log."""
    calls = []
    for line in log.read_text(encoding="utf-8").splitlines()[since:]:
        args, _, text = line.partition("\t")
        words = args.split()
        if "-v" in words:
            calls.append((words[words.index("-v") + 1], text))
    return calls


def log_size(log: Path) -> int:
    return len(log.read_text(encoding="utf-8").splitlines())


async def connected(server: AsgiServer, mac: str, mode: str = "auto") -> SimulatedDevice:
    device = SimulatedDevice(server.http_url, mac=mac, listen_mode=mode, features={"mcp": False})
    await device.connect(f"{server.ws_url}/xiaozhi/v1/", token="")
    await device.hello()
    return device


async def close(device: SimulatedDevice) -> None:
    """Close, then wait for the server's offline write so it cannot race the table flush."""
    await device.close()
    offline = Device.objects.filter(mac=device.identity.mac, is_online=False)
    for _ in range(200):
        if await database_sync_to_async(offline.exists)():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the server did not mark the device offline")


def _unbound_device(persona: dict[str, Any], code: str) -> str:
    device = DeviceFactory(mac=mac_for(next(_macs)), persona=PersonaFactory(**persona))
    ActivationCode.objects.create(device=device, code=code, challenge="c" * 32,
                                  expires_at=timezone.now() + timedelta(hours=1))
    return device.mac


def _bound_device(persona: dict[str, Any]) -> str:
    return BoundDeviceFactory(mac=mac_for(next(_macs)), persona=PersonaFactory(**persona)).mac


@pytest.mark.parametrize(("language", "voice", "text"), [
    ("zh", "cmn", "请在管理后台输入验证码 0 3 2 1 2 5"),
    ("en", "en-us", "Please bind this device in the admin with code 0 3 2 1 2 5."),
])
async def test_an_unbound_device_hears_its_code_digit_by_digit_in_its_personas_language(
    server: AsgiServer, espeak_log: Path, language: str, voice: str, text: str
) -> None:
    mac = await database_sync_to_async(_unbound_device)({**ZH_PERSONA, "language": language}, "032125")
    device = await connected(server, mac)
    try:
        mark, since = device.mark(), log_size(espeak_log)
        await device.listen_start()
        await device.wait_for_tts_stop(timeout=15, since=mark)
        assert device.subtitles == [text]
        assert [e for e in device.events[mark:] if e.kind == "audio"]
        assert spoken(espeak_log, since) == [(voice, text)]  # the persona's edge voice is not espeak's
    finally:
        await close(device)


async def test_when_every_llm_fails_a_chinese_device_hears_the_apology_in_chinese(
    server: AsgiServer, fake_llm: FakeOpenAI, espeak_log: Path
) -> None:
    fake_llm.script(Reply(status=500, error="upstream exploded"))
    device = await connected(server, await database_sync_to_async(_bound_device)(ZH_PERSONA), mode="manual")
    try:
        since = log_size(espeak_log)
        await device.run_turn(speak("hello there"))
        said = apology("zh")
        assert said == "抱歉，我这边出了点问题，请再说一遍。"
        assert device.subtitles == [said]
        assert [e for e in device.events if e.kind == "audio"]
        assert spoken(espeak_log, since) == [("cmn", said)]
    finally:
        await close(device)


async def test_a_chinese_reply_is_spoken_sentence_by_sentence_starting_after_its_first_clause(
    server: AsgiServer, fake_llm: FakeOpenAI, espeak_log: Path
) -> None:
    delay = 0.5
    chunks = ["😊 今天北京", "天气晴朗，", "最高气温", "二十五度。", "出门记得", "涂防晒哦！"]
    fake_llm.script(Reply(chunks=chunks, chunk_delay=delay))
    device = await connected(server, await database_sync_to_async(_bound_device)(ZH_PERSONA), mode="manual")
    try:
        mark, since = device.mark(), log_size(espeak_log)
        await device.run_turn(silence(16000, 200) + speak("what is the weather"))
        assert device.emotion == "happy"
        assert device.subtitles == ["今天北京天气晴朗，", "最高气温二十五度。", "出门记得涂防晒哦！"]
        assert [voice for voice, _ in spoken(espeak_log, since)] == ["cmn"] * 3
        events = device.events[mark:]
        stt = next(e.t for e in events if e.kind == "json" and e.payload.get("type") == "stt")
        starts = [e.t for e in events if e.kind == "json" and e.payload.get("state") == "sentence_start"]
        first_frame = next(e.t for e in events if e.kind == "audio")
        # The first clause is spoken while the model is still writing: the whole reply takes
        # 5 × 0.5 s to stream, the first clause is complete after 1 s.
        assert starts[0] <= first_frame < starts[1]
        assert first_frame - stt < len(chunks) * delay - 0.5, first_frame - stt
    finally:
        await close(device)


async def test_the_stock_greeting_and_farewell_are_said_in_the_personas_language(
    server: AsgiServer, espeak_log: Path
) -> None:
    persona = {**ZH_PERSONA, "greeting": "Hi, I'm listening.", "farewell": "Goodbye!", "exit_phrases": ["hello"]}
    device = await connected(server, await database_sync_to_async(_bound_device)(persona))
    try:
        since = log_size(espeak_log)
        await device.listen_detect("你好小智")
        await device.listen_start()
        await device.wait_for_tts_stop(timeout=15)
        assert device.subtitles == ["你好，我在听。"]
        await device.run_turn(silence(16000, 300) + speak("hello") + silence(16000, 300))  # ASR says "hello"
        assert device.subtitles[-1] == "再见！"
        closed = await device.wait_closed()
        assert closed.payload["code"] == 1000
        assert spoken(espeak_log, since) == [("cmn", "你好，我在听。"), ("cmn", "再见！")]
    finally:
        await close(device)


async def test_a_conversation_ended_by_the_model_without_words_still_says_goodbye_in_chinese(
    server: AsgiServer, fake_llm: FakeOpenAI, espeak_log: Path
) -> None:
    fake_llm.script(Reply(tool_calls=[Call("end_conversation", {})]))
    fake_llm.on_tool_result(Reply(text=""))
    device = await connected(server, await database_sync_to_async(_bound_device)(ZH_PERSONA), mode="manual")
    try:
        since = log_size(espeak_log)
        await device.run_turn(speak("that is all, thank you"))
        assert device.subtitles == ["再见！"]
        assert (await device.wait_closed()).payload["code"] == 1000
        assert spoken(espeak_log, since) == [("cmn", "再见！")]
    finally:
        await close(device)
