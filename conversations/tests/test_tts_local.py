from __future__ import annotations

import os
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conversations.providers.base import TTS, PCMChunk, ProviderError
from conversations.providers.registry import build
from conversations.providers.tts.edge import EdgeTTS, pick_voice
from conversations.providers.tts.espeak import EspeakTTS, parse_voice_list, split_wav_stream
from conversations.providers.tts.voices import ESPEAK_VOICES
from devices.protocol.audio import rms
from testing.server import free_port

SENTENCE = "The kitchen light is now on."


async def collect(tts: TTS, text: str, voice: str = "", language: str = "en") -> list[PCMChunk]:
    return [chunk async for chunk in tts.synthesize(text, voice=voice, language=language)]


# --- espeak-ng ------------------------------------------------------------------------


async def test_espeak_speaks_a_sentence_at_22050_hz() -> None:
    chunks = await collect(EspeakTTS(), SENTENCE)
    assert chunks and all(c.sample_rate == 22050 for c in chunks)
    pcm = b"".join(c.pcm for c in chunks)
    assert len(pcm) % 2 == 0
    assert len(pcm) / 2 / 22050 > 0.5
    assert rms(pcm) > 500  # real speech, not silence


@pytest.mark.parametrize(
    ("voice", "language"),
    [("", "zh-CN"), ("en-US-AriaNeural", "de"), ("de", "en"), ("en+f3", "en"), ("", "xx")],
)
async def test_espeak_accepts_languages_and_ignores_voices_it_does_not_know(
    voice: str, language: str
) -> None:
    chunks = await collect(EspeakTTS(), "one two three", voice=voice, language=language)
    assert sum(len(c.pcm) for c in chunks) > 0


def test_the_language_map_only_names_installed_voices() -> None:
    voices = subprocess.run(["espeak-ng", "--voices"], capture_output=True, text=True, check=True)
    listing = voices.stdout
    known = parse_voice_list(listing)
    assert ESPEAK_VOICES["zh"] == "cmn"
    assert set(ESPEAK_VOICES.values()) <= known


async def test_text_is_not_parsed_as_command_line_options(tmp_path: Path) -> None:
    target = tmp_path / "written.wav"
    chunks = await collect(EspeakTTS(), f"-w {target} hello")
    assert chunks
    assert not target.exists()


async def test_empty_text_yields_nothing() -> None:
    assert await collect(EspeakTTS(), "   ") == []


async def test_a_missing_espeak_binary_is_a_provider_error() -> None:
    with pytest.raises(ProviderError, match="cannot run"):
        await collect(EspeakTTS(binary="/nonexistent/espeak-ng"), SENTENCE)


async def test_a_failing_espeak_is_a_provider_error() -> None:
    with pytest.raises(ProviderError, match="failed"):
        await collect(EspeakTTS(binary="false"), SENTENCE)


async def test_a_hung_espeak_times_out_and_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "slow-espeak"
    marker = tmp_path / "pid"
    script.write_text(f"#!/bin/sh\necho $$ > {marker}\nexec sleep 30\n")
    script.chmod(0o755)
    started = time.perf_counter()
    with pytest.raises(ProviderError, match="timed out"):
        await collect(EspeakTTS(binary=str(script), timeout=0.3), SENTENCE)
    assert time.perf_counter() - started < 2
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not left running


def test_stdout_wav_length_comes_from_the_bytes_not_the_bogus_header() -> None:
    header = b"RIFF" + struct.pack("<I", 0x7FFFF024) + b"WAVEfmt " + struct.pack(
        "<IHHIIHH", 16, 1, 1, 22050, 44100, 2, 16
    ) + b"data" + struct.pack("<I", 0x7FFFF000)
    pcm, rate = split_wav_stream(header + b"\x01\x00\x02\x00\x03")
    assert (pcm, rate) == (b"\x01\x00\x02\x00", 22050)
    with pytest.raises(ProviderError):
        split_wav_stream(b"not a wav at all")


# --- edge-tts -------------------------------------------------------------------------


def test_edge_keeps_edge_voices_and_defaults_others_by_language() -> None:
    assert pick_voice("en-GB-SoniaNeural", "zh") == "en-GB-SoniaNeural"
    assert pick_voice("zh-CN-liaoning-XiaobeiNeural", "en") == "zh-CN-liaoning-XiaobeiNeural"
    assert pick_voice("", "zh-CN") == "zh-CN-XiaoxiaoNeural"
    assert pick_voice("cmn", "en") == "en-US-AriaNeural"
    assert pick_voice("alloy", "xx") == "en-US-AriaNeural"


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback port that accepts connections and never answers (a hung service)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


async def test_edge_fails_fast_with_a_provider_error_when_the_service_hangs(silent_server: int) -> None:
    # Through a proxy that accepts and never answers: no DNS, no internet, the same on every machine.
    started = time.perf_counter()
    with pytest.raises(ProviderError, match="edge-tts failed"):
        await collect(EdgeTTS(connect_timeout=1.0, timeout=2.0, proxy=f"http://127.0.0.1:{silent_server}"), SENTENCE)
    assert time.perf_counter() - started < 3.5  # the provider's timeout, not edge-tts' own 60 s


async def test_edge_fails_at_once_with_a_provider_error_when_unreachable() -> None:
    port = free_port()  # nothing listens there: the connection is refused
    started = time.perf_counter()
    with pytest.raises(ProviderError, match="edge-tts failed"):
        await collect(EdgeTTS(connect_timeout=3.0, timeout=10.0, proxy=f"http://127.0.0.1:{port}"), SENTENCE)
    assert time.perf_counter() - started < 2


def test_tts_providers_build_from_the_registry() -> None:
    espeak = build("tts", "espeak", extra_option=1)
    edge = build("tts", "edge", connect_timeout=2.0)
    assert isinstance(espeak, TTS) and espeak.name == "espeak"
    assert isinstance(edge, TTS) and edge.name == "edge"
