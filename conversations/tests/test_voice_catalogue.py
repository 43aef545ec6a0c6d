"""The voice catalogues behind the admin's voice picker: espeak-ng and Piper for real, Edge's
list through the Celery task with edge-tts's fetch replaced (no network in tests)."""
from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import cache

from conversations import tasks, voice_catalogue
from conversations.providers.tts import voices as voices_module
from conversations.providers.tts.espeak import parse_voice_list
from conversations.providers.tts.piper import bundled_voice
from conversations.providers.tts.voices import OPENAI_VOICES, Voice, list_voices, parse_espeak_voices

EDGE_LIST = [
    {"Name": "Microsoft Server Speech Text to Speech Voice (en-US, AriaNeural)", "ShortName": "en-US-AriaNeural",
     "Gender": "Female", "Locale": "en-US",
     "FriendlyName": "Microsoft Aria Online (Natural) - English (United States)"},
    {"ShortName": "en-GB-RyanNeural", "Gender": "Male", "Locale": "en-GB"},
    {"ShortName": "zh-CN-XiaoxiaoNeural", "Gender": "Female", "Locale": "zh-CN"},
    {"ShortName": "zh-CN-YunxiNeural", "Gender": "Male", "Locale": "zh-CN"},
    {"ShortName": "de-DE-KatjaNeural", "Gender": "Female", "Locale": "de-DE"},
    {"ShortName": "", "Locale": "xx-XX"},  # unusable: dropped
    "not a dict",
]


@pytest.fixture
def data_dir(tmp_path: Path, settings: Any) -> Path:
    settings.DATA_DIR = tmp_path
    cache.delete(voice_catalogue.CACHE_KEY)
    yield tmp_path
    cache.delete(voice_catalogue.CACHE_KEY)


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(voice_catalogue, "_queue_refresh", lambda: calls.append(1))
    return calls


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def edge_fetch(monkeypatch: pytest.MonkeyPatch, result: Any) -> None:
    import edge_tts

    async def list_voices(**_: Any) -> Any:
        if isinstance(result, BaseException):
            raise result
        return result

    monkeypatch.setattr(edge_tts, "list_voices", list_voices)


# --- espeak-ng (the real binary) --------------------------------------------------------


async def test_espeak_lists_its_voices_filtered_by_language() -> None:
    chinese = await list_voices("espeak", "zh-CN")
    assert "cmn" in {v.name for v in chinese} and all(v.speaks("zh") for v in chinese)
    english = {v.name for v in await list_voices("espeak", "en")}
    assert {"en-us", "en-gb"} <= english and "cmn" not in english
    everything = await list_voices("espeak")
    assert len(everything) > 50
    import subprocess

    # Off the event loop, like the catalogue's own call.
    listing = await asyncio.to_thread(subprocess.run, ["espeak-ng", "--voices"], capture_output=True, text=True,
                                      check=True)
    accepted = parse_voice_list(listing.stdout)
    assert {v.name.lower() for v in everything} <= accepted  # every listed name works with -v


def test_espeak_listing_columns_are_parsed() -> None:
    listing = (
        "Pty Language       Age/Gender VoiceName          File                 Other Languages\n"
        " 5  cmn             --/M      Chinese_(Mandarin) sit/cmn              (zh-cmn 5)(zh 5)\n"
        " 5  en-us           --/F      English_(America)  gmw/en-US            (en 3)\n"
        " 5  en-us           --/M      duplicate          gmw/en-US-x\n"
        "garbage\n"
    )
    assert parse_espeak_voices(listing) == [
        Voice("cmn", "cmn", "Chinese (Mandarin)", "male", ("zh",)),
        Voice("en-us", "en-us", "English (America)", "female", ("en",)),
    ]


# --- Piper (the bundled voice and the voices folder) ------------------------------------


async def test_piper_lists_the_bundled_voice_and_the_folders(tmp_path: Path, settings: Any) -> None:
    settings.XIAOZHI_PIPER_VOICES_DIR = tmp_path
    assert [v.name for v in await list_voices("piper", "en")] == ["en_US-joe-medium"]
    assert await list_voices("piper", "de") == []
    bundled = bundled_voice()
    assert bundled is not None
    shutil.copyfile(bundled.model, tmp_path / "de_DE-test-medium.onnx")
    config = json.loads(bundled.config.read_text(encoding="utf-8"))
    config["language"] = {"code": "de_DE"}
    (tmp_path / "de_DE-test-medium.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    assert [(v.name, v.language) for v in await list_voices("piper", "de-AT")] == [("de_DE-test-medium", "de_DE")]
    assert {v.name for v in await list_voices("piper")} == {"en_US-joe-medium", "de_DE-test-medium"}


# --- OpenAI-compatible and unknown kinds ------------------------------------------------


async def test_openai_offers_the_six_standard_voices_in_every_language() -> None:
    assert [v.name for v in await list_voices("openai", "zh")] == sorted(OPENAI_VOICES)
    assert len(OPENAI_VOICES) == 6


async def test_a_kind_without_a_catalogue_has_no_voices() -> None:
    assert await list_voices("fake_tone", "en") == []


# --- Edge: the Celery task, the cache and the file --------------------------------------


async def test_without_a_fetched_list_edge_offers_its_defaults_and_queues_a_fetch(
    data_dir: Path, queued: list[int]
) -> None:
    voices = await list_voices("edge", "zh")
    assert [v.name for v in voices] == ["zh-CN-XiaoxiaoNeural"]
    assert queued == [1]


def test_the_task_stores_the_list_and_a_failed_fetch_keeps_it(
    data_dir: Path, queued: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A sync test: the task is blocking code (it runs its own event loop), as in a worker.
    edge_fetch(monkeypatch, EDGE_LIST)
    assert tasks.edge_voices_refresh.apply().get() == {"ok": True, "count": 5}
    chinese = run(list_voices("edge", "zh"))
    assert [(v.name, v.gender, v.label) for v in chinese] == [
        ("zh-CN-XiaoxiaoNeural", "female", "Xiaoxiao"), ("zh-CN-YunxiNeural", "male", "Yunxi")]
    assert {v.name for v in run(list_voices("edge", "en-US"))} == {"en-US-AriaNeural", "en-GB-RyanNeural"}

    import aiohttp

    edge_fetch(monkeypatch, aiohttp.ClientConnectionError("network is unreachable"))  # offline now
    assert tasks.edge_voices_refresh.apply().get() == {"ok": False, "count": 5}
    assert len(run(list_voices("edge"))) == 5
    edge_fetch(monkeypatch, [])  # an empty or odd reply is not a list either
    assert tasks.edge_voices_refresh.apply().get() == {"ok": False, "count": 5}
    edge_fetch(monkeypatch, {"error": "throttled"})
    assert tasks.edge_voices_refresh.apply().get()["ok"] is False

    cache.delete(voice_catalogue.CACHE_KEY)  # a restart: the cache is gone, the file is not
    assert len(run(list_voices("edge"))) == 5
    assert queued == []
    stored = json.loads((data_dir / "edge-voices.json").read_text(encoding="utf-8"))
    assert len(stored["voices"]) == 5


async def test_a_corrupt_list_file_counts_as_no_list(data_dir: Path, queued: list[int]) -> None:
    (data_dir / "edge-voices.json").write_text("{half a fi", encoding="utf-8")
    assert [v.name for v in await list_voices("edge", "en")] == ["en-US-AriaNeural"]
    assert queued == [1]


def test_the_espeak_catalogue_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(voices_module, "_espeak_catalogue", None)
    first = asyncio.run(voices_module.espeak_voices())
    assert asyncio.run(voices_module.espeak_voices("/nonexistent/espeak-ng")) is first
