"""Offline TTS with espeak-ng: robotic, but 10-20 ms per sentence and always available.

It is the last-resort fallback when cloud TTS is unreachable, and the voice of the tests.
"""
from __future__ import annotations

import asyncio
import logging
import struct
import subprocess
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conversations.providers.base import PCMChunk, ProviderError
from conversations.providers.tts.voices import ESPEAK_VOICES, voice_for

logger = logging.getLogger(__name__)

DEFAULT_RATE = 22050  # what espeak-ng writes; read from the header when it is there
_known_voices: frozenset[str] | None = None


def parse_voice_list(listing: str) -> frozenset[str]:
    """Names `-v` accepts, from `espeak-ng --voices`: language codes and file names."""
    names: set[str] = set()
    for line in listing.splitlines()[1:]:  # first line is the column header
        cols = line.split()
        if len(cols) >= 5:
            names.update({cols[1].lower(), cols[4].lower(), cols[4].rsplit("/", 1)[-1].lower()})
    return frozenset(names)


def split_wav_stream(data: bytes) -> tuple[bytes, int]:
    """PCM and rate from `--stdout` output.

    The streamed header's size fields are bogus (0x7ffff000), so the PCM length comes from
    the byte count: everything after the `data` chunk header (byte 44 in espeak's canonical
    header), trimmed to whole samples.
    """
    marker = data.find(b"data", 12, 256)
    if data[:4] != b"RIFF" or marker < 0:
        raise ProviderError("espeak-ng produced no WAV data")
    rate = struct.unpack_from("<I", data, 24)[0] or DEFAULT_RATE
    pcm = data[marker + 8 :]
    return pcm[: len(pcm) - len(pcm) % 2], rate


_SPAWN_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="espeak")


class EspeakTTS:
    """TTS provider (`conversations.providers.base.TTS`) running the espeak-ng binary."""

    name = "espeak"

    def __init__(
        self, binary: str = "espeak-ng", speed: int = 175, timeout: float = 10.0, **_: Any
    ) -> None:
        self.binary = binary
        self.speed = int(speed)  # words per minute, espeak's -s
        self.timeout = float(timeout)

    async def synthesize(self, text: str, *, voice: str, language: str) -> AsyncIterator[PCMChunk]:
        """One chunk with the whole sentence: espeak renders a sentence in ~15 ms."""
        if not text.strip():
            return
        espeak_voice = await self._pick_voice(voice, language)
        args = ["--stdout", "-v", espeak_voice, "-s", str(self.speed), "--stdin"]
        data = await self._run(args, text)
        pcm, rate = split_wav_stream(data)
        if pcm:
            yield PCMChunk(pcm, rate)

    async def _pick_voice(self, voice: str, language: str) -> str:
        """An espeak voice name passed as `voice` wins; otherwise the language's voice
        (voices.ESPEAK_VOICES: `cmn` for Chinese, `en-us` for English, ...).

        Personas often carry a cloud voice ("zh-CN-XiaoxiaoNeural") while espeak is only the
        offline fallback, so a voice espeak does not know is ignored, not passed through.
        """
        if voice and voice.split("+")[0].lower() in await self._voices():
            return voice
        return voice_for(ESPEAK_VOICES, language)

    async def _voices(self) -> frozenset[str]:
        global _known_voices  # one listing per process; voices do not change at runtime
        if _known_voices is None:
            listing = await self._run(["--voices"], "")
            _known_voices = parse_voice_list(listing.decode("utf-8", "replace"))
        return _known_voices

    async def _run(self, args: list[str], stdin_text: str) -> bytes:
        # Spawned from a small thread pool, not with asyncio's subprocess support: forking a
        # large server process on the event loop stalls every session for milliseconds, and
        # twenty sentences at once stalled pacing by ~50 ms. A cancelled sentence's espeak
        # (~15 ms of work) just finishes in its thread and is reaped there.
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_SPAWN_POOL, self._run_blocking, args, stdin_text)

    def _run_blocking(self, args: list[str], stdin_text: str) -> bytes:
        # Text goes through stdin, never argv: no option injection ("-w /etc/..."), no limit.
        try:
            result = subprocess.run(
                [self.binary, *args], input=stdin_text.encode("utf-8"), capture_output=True,
                timeout=self.timeout, check=False,
            )
        except OSError as exc:  # FileNotFoundError / PermissionError
            raise ProviderError(f"cannot run {self.binary!r}: {exc}") from exc
        except subprocess.TimeoutExpired as exc:  # subprocess.run killed and reaped it
            raise ProviderError(f"espeak-ng timed out after {self.timeout:g} s") from exc
        if result.returncode != 0:
            detail = result.stderr.decode("utf-8", "replace")[:200]
            raise ProviderError(f"espeak-ng failed ({result.returncode}): {detail}")
        return result.stdout
