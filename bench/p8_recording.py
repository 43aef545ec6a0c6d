"""P8 — what recording costs: P1 (turn latency) and P2 (streaming lag) with turn audio
recording off and on, in one run. Target: the difference is within the run's own noise.

    .venv/bin/python bench/p8_recording.py [--rounds 2] [--devices 100] [--duration 60] [--turns 20]
                                           [--streams 200] [--stream-duration 20]

What recording adds (docs/architecture.md, "conversations/ — history, review, recording"):
on the realtime path one list append per uplink packet (the hearing job's packet trail) and
one per downlink frame (the reply's guard); per turn, the history writer hands the packets
to the audio writer (a child process of the server since the P8 fix; `XIAOZHI_AUDIO_WRITER`),
which muxes them into Ogg/Opus without re-encoding and writes two files. P1 ends a turn every
few seconds per device, so it sees all of it (the writer's CPU is counted in the server's:
the whole process tree); P2 never ends an utterance, so it sees the per-packet append and
the trail's trimming.

Each round measures both modes, each on a fresh server and database (bench/common.py
`BenchServer`, XIAOZHI_RECORDING=off or on), the order alternating between rounds so a
machine that drifts (thermal, other load) is not counted against one mode. The noise is the
spread between rounds of the same mode; the verdict compares the modes' medians with it.
Runs bench/p1_latency.py and bench/p2_streaming.py's own code; their options mean the same.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import p1_latency as p1
import p2_streaming as p2
from common import FAKE_PERSONA, BenchServer, core_share, fmt, header, md_table, median, percentile, verdict

MODES = ("off", "on")
FILES_SETTLE_S = 10.0  # the audio writer finishes the last turns' files after the phase


@dataclass
class Result:
    mode: str
    round: int
    p1_one: list[float] = field(default_factory=list)  # first_frame_sent, ms, 1 device
    p1_many: list[float] = field(default_factory=list)  # the same, N devices at once
    p1_cpu: str = "-"
    p1_turns: int = 0
    p1_failures: int = 0
    files: int = 0
    p2_lag_p50: float = float("nan")
    p2_lag_p99: float = float("nan")
    p2_dropped: int = 0
    p2_cpu: str = "-"


def ogg_files(data_dir: Path) -> int:
    return sum(1 for _ in (data_dir / "media").rglob("*.ogg")) if (data_dir / "media").exists() else 0


def settled_files(data_dir: Path, expected: int) -> int:
    """Files written once the audio writer caught up (or FILES_SETTLE_S passed)."""
    deadline = time.monotonic() + FILES_SETTLE_S
    while ogg_files(data_dir) < expected and time.monotonic() < deadline:
        time.sleep(0.25)
    return ogg_files(data_dir)


def env_for(mode: str, connections: int) -> dict[str, str]:
    return {"XIAOZHI_RECORDING": mode, "XIAOZHI_MAX_DEVICE_CONNECTIONS": str(connections + 100),
            "XIAOZHI_IDLE_TIMEOUT_SECONDS": "3600", "XIAOZHI_HARD_TIMEOUT_SECONDS": "3600"}


def run_p1(result: Result, args: argparse.Namespace) -> None:
    # As P1 and P2 by default: the fixed window, no end-of-turn model (unless --turn smart).
    persona = {**FAKE_PERSONA, "language": "en", "vad_min_silence_ms": p1.SILENCE_MS, "greeting": "",
               "turn_detection": args.turn}
    with BenchServer(persona=persona, env=env_for(result.mode, args.devices), prefix=f"p8-p1-{result.mode}-") as bench:
        phases = asyncio.run(p1.run(bench, args))
        one, many = phases
        result.p1_one, result.p1_many = one.server_ms, many.server_ms
        result.p1_cpu = core_share(many.server_cpu, many.seconds)
        result.p1_turns = len(one.server_ms) + len(many.server_ms)
        result.p1_failures = sum(p.timeouts + p.errors for p in phases)
        expected = 2 * result.p1_turns if result.mode == "on" else 0
        result.files = settled_files(bench.data_dir, expected)


def run_p2(result: Result, args: argparse.Namespace) -> None:
    persona = {**FAKE_PERSONA, "language": "en", "vad_min_silence_ms": p2.SILENCE_WINDOW_MS, "greeting": "",
               "turn_detection": args.turn}
    duration = min(args.stream_duration, 26.0)
    with BenchServer(persona=persona, env=env_for(result.mode, args.streams), prefix=f"p8-p2-{result.mode}-") as bench:
        # P2's step on this server (whose env sets the recording mode), the DTX mix P8 always used;
        # p2.run starts servers of its own, so it cannot take this one.
        dtx = p2.speech_loop()
        step = p2.Step(args.streams, mix="dtx")
        asyncio.run(p2.run_step(bench, step, p2.Loops(dtx=dtx, noise=dtx), duration))
    result.p2_lag_p50, result.p2_lag_p99 = step.lag_percentile(0.5), step.lag_percentile(0.99)
    result.p2_dropped = step.dropped
    result.p2_cpu = core_share(step.server_cpu, step.seconds)


def p50_p99(values: list[float]) -> str:
    return f"{fmt(median(values))} / {fmt(percentile(values, 0.99))}"


def row(r: Result) -> list[str]:
    return [r.mode, str(r.round), p50_p99(r.p1_one), p50_p99(r.p1_many), r.p1_cpu, f"{r.p1_turns}", str(r.files),
            str(r.p1_failures), f"{fmt(r.p2_lag_p50)} / {fmt(r.p2_lag_p99)}", str(r.p2_dropped), r.p2_cpu]


def figure(results: list[Result], mode: str, pick: str) -> list[float]:
    """One value per round of `mode`: P1's N-device p50 ("p1") or P2's lag p99 ("p2")."""
    chosen = [r for r in results if r.mode == mode]
    return [median(r.p1_many) if pick == "p1" else r.p2_lag_p99 for r in chosen]


def compare(results: list[Result], pick: str, label: str) -> str:
    off, on = figure(results, "off", pick), figure(results, "on", pick)
    noise = max((max(v) - min(v) for v in (off, on) if len(v) > 1), default=float("nan"))
    delta = median(on) - median(off)
    if noise != noise:
        return (f"P8 {label}: no verdict with one round (off {fmt(median(off))} ms, on {fmt(median(on))} ms); "
                "run --rounds 2 or more")
    allowed = noise + 1.0  # + 1 ms: the figures' own resolution
    return verdict(f"P8 {label}: recording on − off within noise", abs(delta) <= allowed,
                   f"off {fmt(median(off))} ms, on {fmt(median(on))} ms, difference {fmt(delta)} ms, "
                   f"noise (spread between rounds) {fmt(noise)} ms")


def report(results: list[Result], args: argparse.Namespace) -> None:
    print(header("P8 — what recording costs (P1 turn latency and P2 streaming lag, recording off vs on)"))
    print(f"P1: 1 device × {args.turns} turns, then {args.devices} devices for {args.duration:g} s; "
          f"P2: {args.streams} devices streaming for {min(args.stream_duration, 26.0):g} s. "
          "Times in ms (p50 / p99).\n")
    print(md_table(
        ["recording", "round", "P1 1 device", f"P1 {args.devices} devices", "P1 CPU server", "P1 turns",
         "audio files", "P1 timeouts+errors", "P2 lag", "P2 dropped", "P2 CPU server"],
        [row(r) for r in results],
    ))  # fmt: skip
    print("\naudio files: Ogg files written (two per turn with recording on, none with it off).")
    print("CPU: share of one core over the phase (2 cores = 200%); the load generator shares the cores.\n")
    print(compare(results, "p1", f"P1 {args.devices}-device p50"))
    print(compare(results, "p2", f"P2 {args.streams}-device lag p99"))


def main() -> None:
    parser = argparse.ArgumentParser(description="P8: what recording costs (P1 and P2, recording off vs on)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of off + on (the noise estimate needs 2)")
    parser.add_argument("--devices", type=int, default=100, help="P1: devices talking at once")
    parser.add_argument("--duration", type=float, default=60.0, help="P1: seconds of conversation with N devices")
    parser.add_argument("--turns", type=int, default=20, help="P1: turns of the single device")
    parser.add_argument("--streams", type=int, default=200, help="P2: devices streaming at once")
    parser.add_argument("--stream-duration", type=float, default=20.0, help="P2: seconds of streaming (≤ 26)")
    parser.add_argument("--turn", choices=("silence", "smart"), default="silence",
                        help="turn detection of the persona (P1 and P2 default to the fixed window)")
    args = parser.parse_args()
    results: list[Result] = []
    for number in range(1, args.rounds + 1):
        for mode in MODES if number % 2 else tuple(reversed(MODES)):
            result = Result(mode, number)
            print(f"round {number}, recording {mode}: P1", flush=True)
            run_p1(result, args)
            print(f"round {number}, recording {mode}: P2", flush=True)
            run_p2(result, args)
            results.append(result)
    report(results, args)


if __name__ == "__main__":
    main()
