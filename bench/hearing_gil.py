"""The hearing beside a busy event loop: how long a decode + VAD group waits for the
interpreter lock (issue 17, the overload tail).

A web process runs the hearing's groups in a pool thread while its event loop runs Python in
the main thread. Every C call that gives the lock up (an Opus decode through ctypes, a numpy
product or ufunc over more than a few hundred numbers, an onnxruntime run) must take it back
from the loop, and a busy loop hands it back only when the interpreter's switch interval has
passed (5 ms by default). With Silero's products in numpy a group of 24 packets made ~100 such
calls (session 29, gdb); as two onnxruntime graphs it makes 11 (session 30). Each can stretch
the group's wall time far past its CPU time: sessions wait for their packets' turn while the
machine has CPU left.

Here one thread runs `HearingBatch.run_batch` over G sessions (P2's noise mix, as
bench/hearing_floor.py) every 5 ms, while the main thread stands in for a loop at full load
(pure Python, an idle moment of 0.5 ms every ~5 ms, as when epoll has nothing). Per variant:

- decode releases the lock (ctypes.CDLL, as opuslib binds libopus) or holds it (ctypes.PyDLL,
  as devices/protocol/opus.py binds it);
- the interpreter's switch interval (`sys.setswitchinterval`).

Reported: each group's wall time and its thread's CPU time (p50 / p99).

    .venv/bin/python bench/hearing_gil.py [--group 24] [--rounds 300] [--switch-ms 5,1,0.5]
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any

from common import header, md_table, percentile
from hearing_floor import packets_for
from p2_streaming import speech_loop

from conversations.pipeline.endpointing import Ear, EarJob, HearingBatch, VADSettings
from conversations.providers.vad.silero import SileroVAD
from devices.protocol import opus


def releasing_decode() -> Any:
    """libopus's decode as opuslib binds it: through ctypes.CDLL, which gives the lock up."""
    return opus._opuslib().api.decoder.libopus_decode


def run(vad: SileroVAD, rounds: list[list[bytes]], release: bool) -> tuple[list[float], list[float]]:
    size = len(rounds[0])
    ears = [Ear(VADSettings(min_silence_ms=60_000), vad) for _ in range(size)]
    for ear in ears:
        ear._decoder = opus.OpusDecoder(16000)
        if release:
            ear._decoder._opus_decode = releasing_decode()
    batch = HearingBatch(vad)
    walls: list[float] = []
    cpus: list[float] = []
    stop = threading.Event()

    def hear() -> None:
        for group in rounds:
            wall, cpu = time.perf_counter(), time.thread_time()
            batch.run_batch([EarJob(ears[i], [packet], True) for i, packet in enumerate(group)])
            walls.append((time.perf_counter() - wall) * 1e3)
            cpus.append((time.thread_time() - cpu) * 1e3)
            time.sleep(0.005)
        stop.set()

    hearing = threading.Thread(target=hear)
    hearing.start()
    busy_loop(stop)
    hearing.join()
    return walls, cpus


def busy_loop(stop: threading.Event) -> None:
    """The event loop at full load: Python work, and now and then an empty epoll."""
    scratch: dict[int, str] = {}
    ticks = 0
    while not stop.is_set():
        for i in range(200):
            scratch[i] = json.dumps({"type": "audio", "seq": i, "flags": [1, 2, 3]})
        ticks += 1
        if ticks % 20 == 0:
            time.sleep(0.0005)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--group", type=int, default=24, help="sessions per hearing group")
    parser.add_argument("--rounds", type=int, default=300, help="groups per variant")
    parser.add_argument("--switch-ms", default="5,1,0.5", help="comma-separated switch intervals (ms)")
    args = parser.parse_args()
    noise, dtx = speech_loop(noise=True), speech_loop()
    vad = SileroVAD()
    vad.probabilities([(vad.stream(), bytes(1024))])  # load the model outside the timing
    rounds = packets_for(args.group, args.rounds, noise, dtx)
    rows = []
    for switch_ms in (float(ms) for ms in args.switch_ms.split(",")):
        sys.setswitchinterval(switch_ms / 1000)
        for release in (True, False):
            walls, cpus = run(vad, rounds, release)
            rows.append([f"{switch_ms:g}", "releases" if release else "holds",
                         f"{percentile(walls, 0.5):.1f} / {percentile(walls, 0.99):.1f}",
                         f"{percentile(cpus, 0.5):.1f} / {percentile(cpus, 0.99):.1f}"])
    print(header("Hearing beside a busy event loop — wall time of a decode + VAD group (ms)"))
    print(md_table(["switch interval (ms)", "Opus decode and the lock", "group wall p50 / p99",
                    "group CPU p50 / p99"], rows))
    print(f"\n{args.group} sessions a group (P2 noise mix), {args.rounds} groups a variant, the main thread "
          "busy with Python meanwhile.")


if __name__ == "__main__":
    main()
