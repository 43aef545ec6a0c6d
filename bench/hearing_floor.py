"""The decode + VAD floor of one uplink frame, in isolation (issue 17): what hearing costs with
no sockets, no event loop and no hand-offs, to compare with P2's server CPU per frame.

One thread, G sessions (P2's noise mix: even sessions stream room noise at full rate, odd
ones speech with DTX pauses; bench/p2_streaming.py's loops), each with its own Opus decoder
and Silero stream, fed one 60 ms packet per session per round, as a pool group of G jobs:

- decode: `OpusDecoder.decode` of every packet of the group;
- Silero: `SileroVAD.probabilities` over the group's new PCM (the server's batching: step k of
  every stream in one model run, DTX silence gated once the model settled);
- floor = decode + Silero;
- pool job: `HearingBatch.run_batch` over the same group (decode + VAD + endpointing, the
  hearing's pool job as the server runs it: the floor plus its Python glue).

Figures are this thread's CPU time per packet (`time.thread_time`), so other processes on
the machine change them less than wall time would; best of `--repeat` passes.

    .venv/bin/python bench/hearing_floor.py [--groups 1,16,64] [--rounds 200] [--repeat 3]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from common import header, md_table
from p2_streaming import speech_loop

from conversations.pipeline.endpointing import Ear, EarJob, HearingBatch, VADSettings
from conversations.providers.vad.silero import SileroStream, SileroVAD
from devices.protocol.opus import OpusDecoder


def packets_for(groups: int, rounds: int, noise: list[bytes], dtx: list[bytes]) -> list[list[bytes]]:
    """Round r: one packet per session, each session from its own point of its loop."""
    out = []
    for r in range(rounds):
        row = []
        for s in range(groups):
            loop = noise if s % 2 == 0 else dtx
            row.append(loop[(r + 37 * s) % len(loop)])
        out.append(row)
    return out


def cpu_per_packet(run: Callable[[list[bytes]], None], rounds: list[list[bytes]], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.thread_time()
        for group in rounds:
            run(group)
        best = min(best, time.thread_time() - started)
    return best / sum(len(group) for group in rounds) * 1e6


def measure(vad: SileroVAD, size: int, rounds: list[list[bytes]], repeat: int) -> tuple[float, float, float]:
    decoders = [OpusDecoder(16000) for _ in range(size)]
    streams: list[SileroStream] = [vad.stream() for _ in range(size)]
    pcms: list[list[bytes]] = []

    def decode(group: list[bytes]) -> None:
        pcms.append([decoders[i].decode(p) for i, p in enumerate(group)])

    decode_us = cpu_per_packet(decode, rounds, repeat)
    decoded = pcms[: len(rounds)]
    cursor = iter(decoded * repeat)

    def silero(_group: list[bytes]) -> None:
        vad.probabilities(list(zip(streams, next(cursor), strict=True)))

    silero_us = cpu_per_packet(silero, rounds, repeat)
    settings = VADSettings(min_silence_ms=60_000)  # P2's persona: no utterance ends
    ears = [Ear(settings, vad) for _ in range(size)]
    batch = HearingBatch(vad)

    def pool_job(group: list[bytes]) -> None:
        batch.run_batch([EarJob(ears[i], [p], True) for i, p in enumerate(group)])

    job_us = cpu_per_packet(pool_job, rounds, repeat)
    return decode_us, silero_us, job_us


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default="1,16,64", help="comma-separated group sizes (jobs per pool run)")
    parser.add_argument("--rounds", type=int, default=200, help="packets per session per pass (200 = 12 s)")
    parser.add_argument("--repeat", type=int, default=3, help="passes; the fastest counts")
    args = parser.parse_args()
    noise, dtx = speech_loop(noise=True), speech_loop()
    vad = SileroVAD()
    vad.probabilities([(vad.stream(), bytes(1024))])  # load the model outside the timing
    rows = []
    for size in (int(g) for g in args.groups.split(",")):
        rounds = packets_for(size, args.rounds, noise, dtx)
        decode_us, silero_us, job_us = measure(vad, size, rounds, args.repeat)
        rows.append([size, f"{decode_us:.0f}", f"{silero_us:.0f}", f"{decode_us + silero_us:.0f}", f"{job_us:.0f}"])
    print(header("Hearing floor — decode + VAD of one uplink frame in isolation (CPU µs per packet)"))
    print(md_table(["group (jobs per pool run)", "decode", "Silero", "floor", "pool job (decode + VAD + endpointing)"],
                   rows))
    print("\nP2 noise mix: half the sessions room noise at full rate, half speech with DTX pauses; one thread.")


if __name__ == "__main__":
    main()
