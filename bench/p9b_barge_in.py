"""P9b — barge-in with server-side echo cancellation: the user's speech onset → the reply
stops (`tts stop` at the device); target p50 ≤ 400 ms. Also counts false interruptions by the
device's own echo.

    .venv/bin/python bench/p9b_barge_in.py [--trials 8] [--echo-delay-ms 60] [--echo-gain 0.5]

Starts the real server (daphne) on a fresh SQLite database; the default persona gets asr
["faster_whisper"], llm ["openai"] pointed at FakeOpenAI (a long reply, first token after
200 ms) and tts ["espeak"], with the default barge-in settings (180 ms at VAD ≥ 0.8) and
a fixed 800 ms silence window (the end-of-turn model would end the turn at "Stop,", and the
comma pause of ~330 ms comes close to a 500 ms window). One
SimulatedDevice announces `features.aec` over binary protocol v2 and listens in realtime mode
with its microphone always on; its echo path plays every downlink frame back into the
microphone (delay, gain and four decaying reflections) and stamps its uplink with the
firmware's v2 timestamps, so the server's WebRTC canceller (livekit AEC3) and Silero VAD work
on the residual exactly as with a real `CONFIG_USE_SERVER_AEC` board.

Each trial: the user asks a question (Piper speech), the long reply starts, and after a
varying 1.5-3 s of it the user says "Stop, what time is it?" into the microphone. Measured on
the device: the `tts stop` that ends the reply − the speech onset (the first sample above
-40 dBFS, at its scheduled capture time). The new turn's transcript must hold the user's
words. One control trial lets the reply play to the end with only the echo in the
microphone: it must not be interrupted. The simulator's own lateness (how late the
microphone task ran) is reported: on a busy machine it inflates the figures, so run this on
a quiet one.
"""
from __future__ import annotations

import argparse
import asyncio
import random
from dataclasses import dataclass, field
from typing import Any

from common import BenchServer, fmt, header, md_table, median, percentile, verdict

from simulator.device import SimulatedDevice
from simulator.echo import EchoPath
from simulator.events import Event
from testing.fake_openai import FakeOpenAI, Reply
from testing.piper_speech import piper_available, speak
from testing.speech import silence

TARGET_MS = 400.0
FIRST_TOKEN_S = 0.2
LONG_REPLY = (
    "Here is the weather for the whole week. Monday will be sunny and warm with a light breeze. "
    "Tuesday brings clouds in the morning and some rain in the afternoon. "
    "Wednesday and Thursday stay dry, with temperatures around twenty degrees. "
    "The weekend looks bright, so it is a good time for a walk in the park."
)
LAST_SENTENCE = "The weekend looks bright, so it is a good time for a walk in the park."
QUESTION = "What is the weather this week?"
BARGE_IN = "Stop, what time is it?"


@dataclass
class Trial:
    after_s: float
    latency_ms: float | None
    heard: str
    mic_late_ms: float


@dataclass
class Result:
    trials: list[Trial] = field(default_factory=list)
    control_interrupted: bool | None = None
    aec: dict[str, Any] = field(default_factory=dict)
    hearing_lag: tuple[float, float] = (float("nan"), float("nan"))

    @property
    def latencies(self) -> list[float]:
        return [t.latency_ms for t in self.trials if t.latency_ms is not None]


def tts(state: str, after: float) -> Any:
    return lambda e: (e.kind == "json" and e.payload.get("type") == "tts"
                      and e.payload.get("state") == state and e.t > after)


async def ask(device: SimulatedDevice, text: str) -> Event:
    mark = device.mark()
    device.say_into_microphone(speak(text) + silence(16000, 200))
    return await device.wait_for(tts("start", 0.0), since=mark, timeout=30)


async def trial(device: SimulatedDevice, after_s: float) -> Trial:
    start = await ask(device, QUESTION)
    await device.wait_for(lambda e: e.kind == "audio" and e.t > start.t + after_s, timeout=30)
    mark = device.mark()
    onset = await device.say_into_microphone(speak(BARGE_IN) + silence(16000, 200))
    late = max(device.mic_lag[-20:], default=0.0) * 1000
    try:
        stop = await device.wait_for(tts("stop", start.t), since=mark, timeout=15)
        latency: float | None = (stop.t - onset) * 1000
        answer = await device.wait_for(tts("start", stop.t), since=mark, timeout=30)
        heard = device.stt_texts[-1] if device.stt_texts else ""
        await device.wait_for(tts("stop", answer.t), since=mark, timeout=60)
    except Exception:  # noqa: BLE001 - a failed trial is a row, not the end of the bench
        latency, heard = None, ""
    await asyncio.sleep(0.5)
    return Trial(after_s, latency, heard, late)


async def control(device: SimulatedDevice) -> bool:
    """The reply with only its echo in the microphone: True if it was cut short."""
    start = await ask(device, QUESTION)
    await device.wait_for(tts("stop", start.t), timeout=90)
    interrupted = LAST_SENTENCE not in device.subtitles[-6:]
    device.subtitles.clear()
    await asyncio.sleep(0.5)
    return interrupted


async def run(bench: BenchServer, args: argparse.Namespace, result: Result) -> None:
    echo = EchoPath(delay_ms=args.echo_delay_ms, gain=args.echo_gain)
    device = SimulatedDevice(bench.http_url, mac="be:9b:00:00:00:01", listen_mode="realtime", language="en-US",
                             features={"mcp": True, "aec": True}, echo=echo)
    device.protocol_version = 2
    await device.connect(bench.ws_url, token="")
    await device.hello()
    await asyncio.sleep(1.0)  # device MCP handshake
    await device.listen_start()
    device.start_microphone()
    rng = random.Random(9)
    try:
        await trial(device, 1.5)  # warm-up: loads Whisper and the canceller; not measured
        result.control_interrupted = await control(device)
        for _ in range(args.trials):
            result.trials.append(await trial(device, rng.uniform(1.5, 3.0)))
    finally:
        await device.stop_microphone()
        await device.close()
    await asyncio.sleep(1.0)
    stats = bench.stats("hearing stats")
    if stats:
        result.aec = stats[-1].get("aec", {})
        result.hearing_lag = (stats[-1].get("lag_p50_ms", float("nan")), stats[-1].get("lag_p99_ms", float("nan")))


def report(result: Result, args: argparse.Namespace) -> None:
    print(header("P9b — barge-in over the device's own echo (speech onset → tts stop)"))
    voice = "Piper en_US joe" if piper_available() else "espeak-ng (Piper not installed)"
    print(f"user speech: {voice}; reply: espeak-ng, LLM stub first token {FIRST_TOKEN_S * 1000:.0f} ms; "
          f"echo path: {args.echo_delay_ms:g} ms, gain {args.echo_gain:g}, 4 taps; server AEC: WebRTC AEC3 (livekit)\n")
    rows = [[f"{t.after_s:.2f}", fmt(t.latency_ms if t.latency_ms is not None else float("nan")),
             t.heard.strip() or "(none)", fmt(t.mic_late_ms)] for t in result.trials]
    print(md_table(["reply played s", "onset → tts stop ms", "new turn heard", "simulator late ms"], rows,
                   align="rrlr"))
    lat = result.latencies
    print()
    print(md_table(["figure", "p50", "p90", "max"], [
        ["onset → tts stop ms", fmt(median(lat)), fmt(percentile(lat, 0.9)), fmt(max(lat, default=float("nan")))],
    ]))
    print(f"\nserver hearing lag p50/p99 ms: {fmt(result.hearing_lag[0])}/{fmt(result.hearing_lag[1])}; "
          f"canceller alignment: {result.aec or '(no stats)'}")
    heard_ok = sum("time" in t.heard.lower() for t in result.trials)
    print(f"new turn holds the user's words: {heard_ok}/{len(result.trials)}; "
          f"echo alone interrupted the control reply: {result.control_interrupted}\n")
    p50 = median(lat)
    ok = bool(lat) and len(lat) == len(result.trials) and p50 <= TARGET_MS
    print(verdict(f"P9b p50 onset → tts stop ≤ {TARGET_MS:g} ms", ok, f"p50 {fmt(p50)} ms over {len(lat)} trials"))
    print(verdict("P9b the echo never interrupts", result.control_interrupted is False,
                  f"control reply interrupted: {result.control_interrupted}"))


def main() -> None:
    parser = argparse.ArgumentParser(description="P9b: barge-in latency with server-side AEC")
    parser.add_argument("--trials", type=int, default=8, help="measured interruptions (after one warm-up)")
    parser.add_argument("--echo-delay-ms", type=float, default=60.0, help="speaker-to-microphone delay")
    parser.add_argument("--echo-gain", type=float, default=0.5, help="level of the echo's direct path")
    args = parser.parse_args()
    persona = {"asr_providers": ["faster_whisper"], "llm_providers": ["openai"], "tts_providers": ["espeak"],
               "language": "en", "greeting": "", "exit_phrases": [], "vad_min_silence_ms": 800,
               "turn_detection": "silence"}  # "Stop," is a whole turn to the end-of-turn model
    result = Result()
    with FakeOpenAI(default=Reply(text=LONG_REPLY, first_token_delay=FIRST_TOKEN_S)) as fake:
        env = {"LLM_BASE_URL": fake.base_url, "LLM_MODEL": "fake-model"}
        with BenchServer(persona=persona, env=env, prefix="p9b-") as bench:
            asyncio.run(run(bench, args, result))
    report(result, args)


if __name__ == "__main__":
    main()
