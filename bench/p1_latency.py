"""P1 — server-added turn latency: VAD end-of-utterance decision → first downlink Opus frame
written, with zero-latency fake ASR/LLM/TTS; 1 device, then N devices talking at once.

    .venv/bin/python bench/p1_latency.py [--devices 100] [--duration 60] [--turns 20] [--turn silence|smart]

Starts the real server (daphne) on a fresh SQLite database, with the default persona set to
the fake providers of testing/fake_providers.py (asr fake_echo, llm fake_echo, tts fake_tone:
each answers at once). Light devices (bench/loadgen.py: the firmware's handshake, hello and
MCP answers) talk in auto mode like the firmware: `listen start`, real espeak speech as
real-time 60 ms Opus frames, DTX silence until `tts start`, then the mic is off until the
reply has played, a short pause, and again. Devices start at random offsets, so turns end
at random moments, as with real users.

The figure is the server's own: every turn stores `timings` (conversations/pipeline/reply.py)
in ms since the VAD end-of-utterance decision reached the event loop (`speech_end`), and
`first_frame_sent` is taken right after the first Opus frame was handed to the socket.
Cross-check from the device side: first downlink frame received − last speech frame sent −
the persona's silence window (this adds up to one 60 ms uplink frame and Silero's own
end-of-speech smoothing to the server's figure).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import json
import random
import sqlite3
import time
from dataclasses import dataclass, field

from common import (
    FAKE_PERSONA, BenchServer, core_share, fmt, generator_collector_off, header, md_table, median,
    own_cpu_seconds, percentile, steal_note, steal_seconds, verdict,
)
from loadgen import LightDevice, Utterance, mac_for, talk

P50_TARGET_MS, P99_TARGET_MS = 10.0, 30.0
SENTENCE = "what time is it"
SILENCE_MS = 600  # the default persona's vad_min_silence_ms
REPLY_TIMEOUT_S = 15.0
STAGE_KEYS = ("turn_silence_ms", "turn_model_ms", "asr_done", "llm_first_token", "tts_first_audio",
              "first_frame_sent")


@dataclass
class DeviceTurn:
    mac: str
    index: int  # the server's turn index in this session (1, 2, ...)
    last_speech_sent: float
    first_frame: float | None


@dataclass
class Phase:
    name: str
    devices: int
    turns: list[DeviceTurn] = field(default_factory=list)
    timeouts: int = 0
    errors: int = 0
    seconds: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    steal: float = 0.0  # machine-wide CPU seconds the hypervisor gave to other guests
    server_ms: list[float] = field(default_factory=list)  # first_frame_sent per stored turn
    breakdown: dict[str, list[float]] = field(default_factory=dict)
    endpoint_ms: list[float] = field(default_factory=list)  # VAD decision − last speech frame − window

    @property
    def client_ms(self) -> list[float]:
        return [(t.first_frame - t.last_speech_sent) * 1000 - SILENCE_MS for t in self.turns if t.first_frame]


async def one_turn(device: LightDevice, utterance: Utterance, index: int) -> DeviceTurn | None:
    outcome = await talk(device, utterance, REPLY_TIMEOUT_S)
    if outcome is None:
        return None
    last_speech, reply = outcome
    return DeviceTurn(device.mac, index, last_speech, reply.frames[0] if reply.frames else None)


async def converse(device: LightDevice, utterance: Utterance, phase: Phase, *, turns: int, deadline: float,
                   rng: random.Random) -> None:
    loop = asyncio.get_running_loop()
    index = 0
    while index < turns and loop.time() < deadline and not device.closed.is_set():
        index += 1
        turn = await one_turn(device, utterance, index)
        if turn is None:
            phase.timeouts += 1
            return  # the session's turn numbering is no longer known
        phase.turns.append(turn)
        await asyncio.sleep(rng.uniform(0.1, 0.6))  # the user thinks before the next question


async def run_devices(url: str, phase: Phase, utterance: Utterance, *, turns: int, duration: float,
                      first_mac: int) -> None:
    rng = random.Random(phase.devices)
    devices = [LightDevice(url, mac_for(first_mac + i)) for i in range(phase.devices)]
    for chunk in range(0, len(devices), 50):
        await asyncio.gather(*(d.connect() for d in devices[chunk : chunk + 50]))
        await asyncio.gather(*(d.hello() for d in devices[chunk : chunk + 50]))
    await asyncio.sleep(1.0)  # MCP initialize + tools/list answered
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration

    async def start_later(device: LightDevice) -> None:
        await asyncio.sleep(rng.uniform(0, 3.0) if phase.devices > 1 else 0)
        await converse(device, utterance, phase, turns=turns, deadline=deadline, rng=rng)

    started = time.perf_counter()
    await asyncio.gather(*(start_later(d) for d in devices))
    phase.seconds = time.perf_counter() - started
    phase.errors = sum(len(d.errors) for d in devices)
    await asyncio.gather(*(d.close() for d in devices))


def stored_turns(bench: BenchServer, since_id: int) -> dict[tuple[str, int], dict[str, float]]:
    """(mac, turn index) → timings of the turns stored after `since_id`."""
    query = (
        'SELECT d.mac, t."index", t.timings FROM conversations_turn t '
        "JOIN conversations_conversation c ON c.id = t.conversation_id "
        "JOIN devices_device d ON d.id = c.device_id WHERE t.id > ?"
    )
    with sqlite3.connect(bench.db_path) as db:
        return {(mac, index): json.loads(timings) for mac, index, timings in db.execute(query, (since_id,))}


async def wait_stored(bench: BenchServer, since_id: int, expected: int, timeout: float = 15.0) -> None:
    """History is written in the background after each turn; wait until it has caught up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(stored_turns(bench, since_id)) < expected:
        await asyncio.sleep(0.25)


async def run_phase(bench: BenchServer, phase: Phase, utterance: Utterance, args: argparse.Namespace,
                    first_mac: int) -> None:
    since = bench.last_turn_id()
    server_cpu, client_cpu, steal = bench.cpu_seconds(), own_cpu_seconds(), steal_seconds()
    turns = args.turns if phase.devices == 1 else 10**6
    duration = 10**6 if phase.devices == 1 else args.duration
    await run_devices(bench.ws_url, phase, utterance, turns=turns, duration=duration, first_mac=first_mac)
    phase.server_cpu = bench.cpu_seconds() - server_cpu
    phase.client_cpu = own_cpu_seconds() - client_cpu
    phase.steal = steal_seconds() - steal
    await wait_stored(bench, since, len(phase.turns))
    stored = stored_turns(bench, since)
    for key in STAGE_KEYS:
        phase.breakdown[key] = [t[key] for t in stored.values() if key in t]
    phase.server_ms = phase.breakdown["first_frame_sent"]
    for turn in phase.turns:
        timings = stored.get((turn.mac, turn.index))
        if timings and turn.first_frame and "first_frame_sent" in timings:
            decided = turn.first_frame - timings["first_frame_sent"] / 1000
            phase.endpoint_ms.append((decided - turn.last_speech_sent) * 1000 - SILENCE_MS)


def row(phase: Phase) -> list[str]:
    server, client = phase.server_ms, phase.client_ms
    cpu = f"{core_share(phase.server_cpu, phase.seconds)} / {core_share(phase.client_cpu, phase.seconds)}"
    return [
        phase.name, str(phase.devices), str(len(server)),
        fmt(median(server)), fmt(percentile(server, 0.99)), fmt(max(server, default=float("nan"))),
        fmt(median(client)), fmt(percentile(client, 0.99)),
        str(phase.timeouts + phase.errors), cpu, core_share(phase.steal, phase.seconds),
    ]


def breakdown_rows(phases: list[Phase]) -> list[list[str]]:
    rows = []
    for phase in phases:
        cells = [phase.name]
        for key in STAGE_KEYS:
            values = phase.breakdown.get(key, [])
            cells.append(f"{fmt(median(values))} / {fmt(percentile(values, 0.99))}")
        cells.append(f"{fmt(median(phase.endpoint_ms))} / {fmt(percentile(phase.endpoint_ms, 0.99))}")
        rows.append(cells)
    return rows


def report(phases: list[Phase]) -> None:
    print(header("P1 — server-added turn latency (VAD end-of-utterance decision → first Opus frame written)"))
    print(md_table(
        ["scenario", "devices", "turns", "server p50 ms", "server p99 ms", "server max ms",
         "device-side p50 ms", "device-side p99 ms", "timeouts+errors", "CPU server / load gen", "steal"],
        [row(p) for p in phases],
    ))  # fmt: skip
    print("\nServer timings per stage, ms after the VAD decision (p50 / p99); last column: VAD decision")
    print(f"after the last speech frame was sent, minus the {SILENCE_MS} ms silence window:\n")
    print(md_table(["scenario", *STAGE_KEYS, "endpointing beyond window"], breakdown_rows(phases)))
    print("\n(turn_model_ms: Smart Turn's run per turn, `--turn smart`; turn_silence_ms: quiet heard after the")
    print("last voice when the turn ended, in either mode)")
    print("\nCPU: share of one core over the phase (2 cores = 200%); the load generator runs on the same cores.")
    print(steal_note("phase"))
    for phase in phases:
        ok = median(phase.server_ms) <= P50_TARGET_MS and percentile(phase.server_ms, 0.99) <= P99_TARGET_MS
        ok = ok and bool(phase.server_ms) and phase.timeouts == 0
        print(verdict(f"P1 {phase.name}: p50 ≤ {P50_TARGET_MS:g} ms, p99 ≤ {P99_TARGET_MS:g} ms", ok,
                      f"p50 {fmt(median(phase.server_ms))} ms, p99 {fmt(percentile(phase.server_ms, 0.99))} ms, "
                      f"{len(phase.server_ms)} turns, {phase.timeouts} timeouts"))


async def run(bench: BenchServer, args: argparse.Namespace) -> list[Phase]:
    utterance = Utterance.spoken(SENTENCE, tail_ms=3000)
    phases = [Phase("1 device", 1), Phase(f"{args.devices} devices at once", args.devices)]
    await run_phase(bench, phases[0], utterance, args, first_mac=0x100000)
    await run_phase(bench, phases[1], utterance, args, first_mac=0x200000)
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description="P1: server-added turn latency")
    parser.add_argument("--devices", type=int, default=100, help="devices talking at once")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of conversation with N devices")
    parser.add_argument("--turns", type=int, default=20, help="turns of the single device")
    parser.add_argument("--turn", choices=("silence", "smart"), default="silence",
                        help="the persona's turn detection (smart: Smart Turn v3.2 runs once per pause)")
    parser.add_argument("--workers", type=int, default=1, help="web workers sharing the port (needs --redis if > 1)")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", ""),
                        help="Redis linking the workers (its database is flushed per server start)")
    args = parser.parse_args()
    persona = {**FAKE_PERSONA, "language": "en", "vad_min_silence_ms": SILENCE_MS, "greeting": "",
               "turn_detection": args.turn}
    env = {"XIAOZHI_MAX_DEVICE_CONNECTIONS": str(args.devices + 100), "XIAOZHI_IDLE_TIMEOUT_SECONDS": "3600",
           "XIAOZHI_HARD_TIMEOUT_SECONDS": "3600"}
    with BenchServer(persona=persona, env=env, prefix="p1-", workers=args.workers, redis_url=args.redis) as bench:
        generator_collector_off()
        phases = asyncio.run(run(bench, args))
    report(phases)


if __name__ == "__main__":
    main()
