"""P9 — turn taking: semantic end of turn (Smart Turn v3.2) against the fixed silence window.

    .venv/bin/python bench/p9_turn_taking.py [--pause-ms 100] [--max-silence-ms 1500] [--silence-ms 600]
                                             [--asr-threads 2] [--limit N]

The shared utterances of testing/utterances.py (Piper en_US, 10 with a 600-900 ms pause in
the middle of the sentence, 10 complete) are asked by one SimulatedDevice (real-time Opus
uplink) in both modes, one after the other, on one real server: the default persona with
"smart" turn detection, then with "silence". faster-whisper tiny.en, an LLM stub answering
"Okay." at once, espeak-ng.

Figures, per mode, from the turns the server stored:
- cuts: paused utterances that became more than one turn (the server answered at the pause);
- end of speech → turn end: `turn_silence_ms`, the quiet the server heard after the last
  voice before it ended the turn (audio time: the model's run is inside it, since the device
  keeps streaming while the model thinks), mean and p50, over the complete utterances;
- the device's end of speech (uplink frame holding the last voiced sample) → first reply
  frame, p50, over the complete utterances;
- Smart Turn inference (`turn_model_ms`, the last check of each turn) p50 and p99, and how
  many complete utterances the model ended (the rest waited for the maximum silence).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

from common import BenchServer, fmt, header, md_table, median, percentile, verdict
from loadgen import last_speech_frame

from simulator.device import SimulatedDevice
from testing.fake_openai import FakeOpenAI, Reply
from testing.speech import silence
from testing.utterances import TestUtterance, build_utterances

TARGET_SOONER_MS = 300.0  # issue 16: smart ends complete turns >= 300 ms sooner on average
LEAD_MS = 400


@dataclass
class Asked:
    utterance: TestUtterance
    first_frame_ms: float | None  # device: end of speech → first reply frame
    heard: list[str] = field(default_factory=list)  # the server's `stt` texts for it (2+: cut)

    @property
    def cut(self) -> bool:
        """Answered at the pause: more than one turn, or the words after the pause missing."""
        if not self.utterance.paused:
            return False
        after = set(re.findall(r"[a-z]+", self.utterance.text.split("…")[1].lower()))
        heard = set(re.findall(r"[a-z]+", " ".join(self.heard[-1:]).lower()))
        return len(self.heard) != 1 or len(after & heard) < max(1, len(after) // 2)


@dataclass
class Mode:
    name: str
    asked: list[Asked] = field(default_factory=list)
    turns: list[tuple[str, dict[str, float]]] = field(default_factory=list)  # (user_text, timings)


async def ask(device: SimulatedDevice, utterance: TestUtterance) -> Asked:
    pcm = silence(16000, LEAD_MS) + utterance.pcm
    uplink_before, mark, heard_before = len(device.uplink_times), device.mark(), len(device.stt_texts)
    await device.run_turn(pcm, timeout=60)
    last = last_speech_frame(pcm)
    first = next((e.t for e in device.events[mark:] if e.kind == "audio" and e.payload.accepted), None)
    latency = None
    if first is not None and len(device.uplink_times) > uplink_before + last:
        latency = (first - device.uplink_times[uplink_before + last]) * 1000
    await asyncio.sleep(max(0.0, device.speaker.play_end - time.monotonic()) + 0.3)
    if utterance.paused:  # a cut leaves the rest of the sentence to become a turn of its own
        await asyncio.sleep(2.0)
        await asyncio.sleep(max(0.0, device.speaker.play_end - time.monotonic()) + 0.3)
    return Asked(utterance, latency, device.stt_texts[heard_before:])


async def run_mode(bench: BenchServer, mode: Mode, utterances: list[TestUtterance], warm_up: TestUtterance,
                   mac: str) -> None:
    device = SimulatedDevice(bench.http_url, mac=mac, listen_mode="auto", language="en-US")
    await device.connect(bench.ws_url, token="")
    await device.hello()
    await asyncio.sleep(1.0)  # device MCP handshake
    try:
        await ask(device, warm_up)  # loads Whisper and the turn model: not measured
        since = bench.last_turn_id()
        for utterance in utterances:
            mode.asked.append(await ask(device, utterance))
    finally:
        await device.close()
    await asyncio.sleep(1.0)
    with sqlite3.connect(bench.db_path) as db:
        rows = db.execute("SELECT user_text, timings FROM conversations_turn WHERE id > ? ORDER BY id", (since,))
        mode.turns = [(text, json.loads(timings)) for text, timings in rows.fetchall()]


def split_turns(mode: Mode) -> tuple[int, list[dict[str, float]]]:
    """(cuts at pauses, timings of the complete utterances' turns). Stored turns and `stt`
    messages come in the same order (a turn is stored when something was heard), so each
    utterance owns as many stored turns as it got `stt` messages."""
    cuts, complete = 0, []
    position = 0
    for asked in mode.asked:
        own = mode.turns[position : position + len(asked.heard)]
        position += len(asked.heard)
        cuts += asked.cut
        if not asked.utterance.paused and own:
            complete.append(own[-1][1])
    return cuts, complete


def report(modes: list[Mode], args: argparse.Namespace) -> None:
    print(header("P9 — turn taking: Smart Turn v3.2 against a fixed silence window"))
    print(f"Piper en_US joe (testing/utterances.py), faster-whisper tiny.en ({args.asr_threads} threads), LLM stub, "
          f"espeak-ng; smart: pause "
          f"{args.pause_ms} ms, maximum silence {args.max_silence_ms} ms; silence: {args.silence_ms} ms\n")
    rows, waits = [], {}
    for mode in modes:
        cuts, complete = split_turns(mode)
        silence_ms = [t["turn_silence_ms"] for t in complete if "turn_silence_ms" in t]
        waits[mode.name] = silence_ms
        first = [a.first_frame_ms for a in mode.asked if not a.utterance.paused and a.first_frame_ms is not None]
        model = [t["turn_model_ms"] for _, t in mode.turns if "turn_model_ms" in t]
        by_model = sum(t.get("turn_complete") == 1.0 for t in complete)
        rows.append([mode.name, f"{cuts} / {sum(a.utterance.paused for a in mode.asked)}",
                     fmt(mean(silence_ms) if silence_ms else float("nan")), fmt(median(silence_ms)),
                     fmt(median(first)), fmt(median(model)), fmt(percentile(model, 0.99)),
                     f"{by_model} / {len(complete)}" if model else "-"])
    print(md_table(["mode", "cut at the pause", "end of speech → turn end, mean ms", "p50 ms",
                    "end of speech → first frame p50 ms", "model p50 ms", "model p99 ms", "ended by the model"],
                   rows))
    print()
    for mode in modes:
        for asked in mode.asked:
            if asked.cut:
                print(f"- {mode.name}: cut \"{asked.utterance.text}\" (pause {asked.utterance.pause_ms} ms); "
                      f"heard {asked.heard}")
    print()
    smart, fixed = waits.get("smart", []), waits.get("silence", [])
    if smart and fixed:
        sooner = mean(fixed) - mean(smart)
        cuts = split_turns(modes[0])[0]
        print(verdict(f"smart ends complete turns ≥ {TARGET_SOONER_MS:g} ms sooner on average, no cut",
                      sooner >= TARGET_SOONER_MS and cuts == 0, f"{fmt(sooner)} ms sooner, {cuts} cuts"))


def main() -> None:
    parser = argparse.ArgumentParser(description="P9: semantic end of turn against a fixed silence window")
    parser.add_argument("--pause-ms", type=int, default=100, help="smart: the persona's turn_pause_ms")
    parser.add_argument("--max-silence-ms", type=int, default=1500, help="smart: turn_max_silence_ms")
    parser.add_argument("--silence-ms", type=int, default=600, help="silence: vad_min_silence_ms")
    parser.add_argument("--limit", type=int, default=0, help="ask only the first N paused and N complete (smoke)")
    parser.add_argument("--asr-threads", type=int, default=2, help="ASR_WHISPER_THREADS of the server (2: its default)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="p9-piper-") as cache:
        utterances = build_utterances(Path(cache))
    paused = [u for u in utterances if u.paused]
    complete = [u for u in utterances if not u.paused]
    if args.limit:
        paused, complete = paused[: args.limit], complete[: args.limit]
    warm_up = complete[-1]
    base = {"asr_providers": ["faster_whisper"], "llm_providers": ["openai"], "tts_providers": ["espeak"],
            "language": "en", "greeting": "", "exit_phrases": [], "record_audio": False}
    settings = {
        "smart": {"turn_detection": "smart", "turn_pause_ms": args.pause_ms,
                  "turn_max_silence_ms": args.max_silence_ms},
        "silence": {"turn_detection": "silence", "vad_min_silence_ms": args.silence_ms},
    }
    modes = [Mode("smart"), Mode("silence")]
    with FakeOpenAI(default=Reply(text="Okay.")) as fake:
        env = {"LLM_BASE_URL": fake.base_url, "LLM_MODEL": "fake-model", "ASR_WHISPER_THREADS": str(args.asr_threads)}
        with BenchServer(persona={**base, **settings["smart"]}, env=env, prefix="p9-") as bench:
            for index, mode in enumerate(modes):
                bench.persona = {**base, **settings[mode.name]}
                bench.prepare()  # the default persona, read by each new session
                asyncio.run(run_mode(bench, mode, paused + complete, warm_up, f"be:90:00:00:00:{index + 1:02x}"))
    report(modes, args)


if __name__ == "__main__":
    main()
