"""Count the Python calls one uplink frame costs, from the session's frame handler to the
VAD decision (no timing: a count is the same on a busy and a quiet machine).

It builds a real VoiceSession + VoiceEngine in this process (fake ASR/LLM/TTS, real Opus
and Silero), says hello and `listen start`, then feeds espeak speech one 60 ms Opus packet
at a time, waiting for each packet's decode + VAD to finish before the next, so every
packet is a batch of one (a lone device). A profiler counts function calls in every thread;
calls into the project's own code are listed by function, the rest summed.

    .venv/bin/python bench/frame_path.py [--packets 40]
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import threading
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
if str(BASE_DIR) not in sys.path:
    sys.path.insert(0, str(BASE_DIR))

import testing.fake_providers  # noqa: E402,F401 - registers the fake kinds
from conversations.pipeline.config import DeviceInfo, PersonaConfig, SessionConfig  # noqa: E402
from conversations.pipeline.engine import VoiceEngine  # noqa: E402
from conversations.pipeline.session import VoiceSession  # noqa: E402
from testing.speech import opus_packets, silence, speak  # noqa: E402

PROJECT = str(BASE_DIR)
VENV = str(BASE_DIR / ".venv")
HELLO = json.dumps({"type": "hello", "version": 1, "features": {}, "transport": "websocket",
                    "audio_params": {"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60}})
LISTEN = json.dumps({"type": "listen", "state": "start", "mode": "auto"})


class NullTransport:
    async def send_text(self, text: str) -> None: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class Counter:
    def __init__(self) -> None:
        self.ours: collections.Counter[tuple[str, str]] = collections.Counter()
        self.others: collections.Counter[tuple[str, str]] = collections.Counter()
        self.on = False
        self.lock = threading.Lock()

    def profile(self, frame: Any, event: str, _arg: Any) -> None:
        if not self.on or event != "call":
            return
        filename = frame.f_code.co_filename
        if filename.startswith(PROJECT) and not filename.startswith(VENV) and "/bench/" not in filename:
            key = (str(Path(filename).relative_to(BASE_DIR)), frame.f_code.co_qualname)
            with self.lock:
                self.ours[key] += 1
        else:
            key = (Path(filename).name, frame.f_code.co_qualname)
            with self.lock:
                self.others[key] += 1


async def main(packets: int, verbose: bool) -> None:
    counter = Counter()
    threading.setprofile(counter.profile)
    sys.setprofile(counter.profile)
    config = SessionConfig(
        session_id="frame-path", device=DeviceInfo(id=1, mac="aa:bb:cc:dd:ee:ff"),
        persona=PersonaConfig(asr=("fake_echo",), llm=("fake_echo",), tts=("fake_tone",)),
    )
    session = VoiceSession(NullTransport(), config, engine_factory=VoiceEngine)
    await session.start()
    await session.feed_text(HELLO)
    await session.feed_text(LISTEN)
    engine = session.engine
    hearing = engine.hearing  # type: ignore[union-attr]
    stream = opus_packets(silence(16000, 600) + speak("turn on the kitchen light") + silence(16000, 300))
    heard = _watch(hearing)
    warm = 5
    for packet in stream[:warm]:  # load the model, start the pool threads
        await session.feed_bytes(packet)
        await heard()
    counted = stream[warm : warm + packets]
    counter.on = True
    for packet in counted:
        await session.feed_bytes(packet)
        await heard()  # one wake-up when the packet's decode + VAD is done: no polling
    counter.on = False
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    await session.aclose()
    report(counter, len(counted), verbose)


def _watch(hearing: Any) -> Any:
    """An awaitable per packet that returns once the hearing has logged the packet's lag."""
    done = asyncio.Event()
    add = hearing.lag.add

    def added(seconds: float) -> None:
        add(seconds)
        done.set()

    hearing.lag.add = added

    async def heard() -> None:
        await done.wait()
        done.clear()

    return heard


def report(counter: Counter, packets: int, verbose: bool = False) -> None:
    total = sum(counter.ours.values())
    files = sorted({path for path, _ in counter.ours})
    print(f"packets counted: {packets}")
    print(f"project calls per packet: {total / packets:.1f} in {len(counter.ours)} functions of {len(files)} files")
    print(f"other Python calls per packet (stdlib, numpy, ...): {sum(counter.others.values()) / packets:.1f}")
    for (path, name), count in sorted(counter.ours.items(), key=lambda item: (item[0][0], -item[1])):
        print(f"  {count / packets:6.2f}  {path}:{name}")
    if verbose:
        print("other calls, most frequent:")
        for (path, name), count in counter.others.most_common(25):
            print(f"  {count / packets:6.2f}  {path}:{name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=40)
    parser.add_argument("--verbose", action="store_true", help="also list the most frequent other calls")
    args = parser.parse_args()
    asyncio.run(main(args.packets, args.verbose))
