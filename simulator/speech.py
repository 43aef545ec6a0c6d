"""Speech the simulated device can say (`simulate_device --say`), synthesized offline with
espeak-ng. The tests and benchmarks take their speech from here too (testing/speech.py)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from devices.protocol.audio import read_wav, resample

DEVICE_RATE = 16000  # uplink rate of the Xiaozhi firmware
_ESPEAK_TIMEOUT_S = 10.0


def espeak_available() -> bool:
    return shutil.which("espeak-ng") is not None


@lru_cache(maxsize=64)
def speak(text: str, *, rate: int = DEVICE_RATE, voice: str = "en") -> bytes:
    """`text` spoken by espeak-ng as s16le mono PCM at `rate` (cached per arguments).

    Uses `-w file` rather than `--stdout`: the streamed WAV header carries a bogus size.
    """
    with tempfile.TemporaryDirectory(prefix="speak-") as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(
            ["espeak-ng", "-v", voice, "-w", str(path), "--stdin"],
            input=text.encode("utf-8"),
            check=True,
            capture_output=True,
            timeout=_ESPEAK_TIMEOUT_S,
        )
        pcm, source_rate = read_wav(path)
    return resample(pcm, source_rate, rate)


