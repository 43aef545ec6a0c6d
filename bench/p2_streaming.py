"""P2 — streaming capacity: N devices sending real-time 60 ms Opus uplink at once; every frame
decoded and VAD-checked within 60 ms of arrival (p99), none dropped. Target: N ≥ 200.

    .venv/bin/python bench/p2_streaming.py [--devices 50,100,150,200] [--duration 20]

For each N, a fresh server process (daphne, same fresh SQLite database) and N light devices
(bench/loadgen.py: firmware handshake, hello, MCP answers; no per-device threads) that send
`listen start` (auto), at random moments over the first 2 s, and then stream a pre-encoded loop
of real espeak sentences and silence (about 60% speech; silence as the device's DTX packets) on
an absolute 60 ms clock,
each device from a random point of the loop and a random phase, for `--duration` seconds.
The persona's silence window is set to 60 s so no utterance ends during a step: all N
devices stream all the time, and the server does nothing but hear (decode, VAD, endpointing,
speculative-ASR pauses with the instant fake ASR).

Server side, every session's hearing counts its packets and drops and keeps a histogram of
the lag from a packet's arrival in the session (`Hearing.push`, on the event loop) to the end
of the decode + VAD of the batch holding it (back on the event loop); it logs them as
"hearing stats" when the session closes (bench/server_settings.py writes them to a file).
What happens before `push` (kernel, daphne, Channels) is seen by a probe device sending a
repeated hello every 100 ms: its round trip is the event loop's responsiveness under load.
The load generator runs on the same two cores; its own lateness is reported.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

from common import (
    FAKE_PERSONA, BenchServer, core_share, cpu_seconds, fmt, header, md_table, median, own_cpu_seconds, percentile,
    verdict,
)
from loadgen import FRAME_S, LightDevice, mac_for

from testing.speech import opus_packets, silence, speak

LAG_TARGET_MS = 60.0
TARGET_DEVICES = 200
START_SPREAD_S = 2.0  # devices start streaming at random moments over this long
SILENCE_WINDOW_MS = 60_000  # no utterance ends while a step runs (MAX_UTTERANCE_MS is 30 s)
SENTENCES = [
    "turn on the kitchen light",
    "what is the weather going to be like tomorrow morning",
    "please remind me to call my mother at six o'clock",
    "tell me a story about a little robot",
]


def speech_loop() -> list[bytes]:
    """~12 s of audio: each sentence followed by 0.6-1.2 s of silence, encoded as a device does."""
    pcm = b""
    for index, sentence in enumerate(SENTENCES):
        pcm += speak(sentence) + silence(16000, 600 + 200 * index)
    return opus_packets(pcm)


@dataclass
class Step:
    devices: int
    sent: int = 0
    connected: int = 0
    late_ms: list[float] = field(default_factory=list)  # generator lateness, sampled
    probe_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    sessions: int = 0
    packets: int = 0
    dropped: int = 0
    ignored: int = 0
    invalid: int = 0
    lag_hist: dict[int, int] = field(default_factory=dict)
    lag_max_ms: float = 0.0

    def lag_percentile(self, q: float) -> float:
        total = sum(self.lag_hist.values())
        if not total:
            return float("nan")
        rank, seen = q * total, 0
        for bucket in sorted(self.lag_hist):
            seen += self.lag_hist[bucket]
            if seen >= rank:
                return bucket + 1.0  # upper edge of the 1 ms bucket
        return self.lag_max_ms

    @property
    def ok(self) -> bool:
        return (self.connected == self.devices and self.dropped == 0 and self.packets > 0
                and self.lag_percentile(0.99) <= LAG_TARGET_MS)


async def stream(device: LightDevice, packets: list[bytes], offset: int, start: float, end: float,
                 step: Step, sample: bool) -> None:
    """`listen start` just before `start`, then the loop of packets from `offset` until `end`."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start - 0.05 - loop.time()))
    await device.listen_start("auto")
    index = 0
    while not device.closed.is_set():
        due = start + index * FRAME_S
        if due >= end:
            return
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif sample:
            step.late_ms.append(-delay * 1000)
        if not await device.send_packet(packets[(offset + index) % len(packets)]):
            return
        index += 1


async def probe(url: str, step: Step, end: float) -> None:
    device = LightDevice(url, mac_for(0x4FFFFF), mcp=False)
    await device.connect()
    await device.hello()
    loop = asyncio.get_running_loop()
    while loop.time() < end:
        await asyncio.sleep(0.1)
        step.probe_ms.append(await device.hello() * 1000)
    await device.close()


async def settle(devices: list[LightDevice], timeout: float = 30.0) -> None:
    """Wait until every device has answered the server's MCP initialize and tools/list."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(d.mcp_pending or d.mcp_answered < 2 for d in devices):
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.0)


async def drive(url: str, step: Step, packets: list[bytes], duration: float) -> list[LightDevice]:
    rng = random.Random(step.devices)
    devices = [LightDevice(url, mac_for(0x400000 + i)) for i in range(step.devices)]
    for chunk in range(0, len(devices), 50):
        part = devices[chunk : chunk + 50]
        await asyncio.gather(*(d.connect() for d in part))
        await asyncio.gather(*(d.hello() for d in part))
    step.connected = sum(not d.closed.is_set() for d in devices)
    await settle(devices)  # connecting is P3's subject: stream once the MCP handshakes are over
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2
    end = start + START_SPREAD_S + duration
    tasks = [  # users do not all press the button in the same millisecond
        stream(d, packets, rng.randrange(len(packets)), start + rng.uniform(0, START_SPREAD_S), end, step, i % 10 == 0)
        for i, d in enumerate(devices)
    ]
    started = time.perf_counter()
    await asyncio.gather(probe(url, step, end), *tasks)
    step.seconds = time.perf_counter() - started
    step.sent = sum(d.sent for d in devices)
    return devices


def collect(step: Step, records: list[dict[str, Any]]) -> None:
    step.sessions = len(records)
    for record in records:
        step.packets += int(record.get("packets", 0))
        step.dropped += int(record.get("dropped", 0))
        step.ignored += int(record.get("ignored", 0))
        step.invalid += int(record.get("invalid", 0))
        step.lag_max_ms = max(step.lag_max_ms, float(record.get("lag_max_ms", 0.0)))
        for bucket, count in (record.get("lag_histogram_ms") or {}).items():
            step.lag_hist[int(bucket)] = step.lag_hist.get(int(bucket), 0) + int(count)


async def wait_for_stats(bench: BenchServer, sessions: int, timeout: float = 20.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    records = bench.stats("hearing stats")
    while len(records) < sessions and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        records = bench.stats("hearing stats")
    return records


async def run_step(bench: BenchServer, step: Step, packets: list[bytes], duration: float) -> None:
    server_cpu, client_cpu = cpu_seconds(bench.pid), own_cpu_seconds()
    devices = await drive(bench.ws_url, step, packets, duration)
    step.server_cpu = cpu_seconds(bench.pid) - server_cpu
    step.client_cpu = own_cpu_seconds() - client_cpu
    await asyncio.sleep(1.0)  # the last packets are heard before the sockets go
    await asyncio.gather(*(d.close() for d in devices))
    collect(step, await wait_for_stats(bench, step.devices + 1))  # + the probe's session


def row(step: Step) -> list[str]:
    return [
        str(step.devices), f"{step.connected}", str(step.sent), str(step.packets), str(step.dropped),
        fmt(step.lag_percentile(0.5)), fmt(step.lag_percentile(0.99)), fmt(step.lag_max_ms),
        fmt(median(step.probe_ms), 1), fmt(percentile(step.probe_ms, 0.99), 1),
        fmt(percentile(step.late_ms, 0.99), 1) if step.late_ms else "0.0",
        f"{core_share(step.server_cpu, step.seconds)} / {core_share(step.client_cpu, step.seconds)}",
        "PASS" if step.ok else "FAIL",
    ]


def report(steps: list[Step], duration: float) -> None:
    print(header("P2 — streaming capacity (real-time 60 ms Opus uplink, decode + VAD lag)"))
    print(f"{duration:g} s of streaming per step; lag = arrival in the session → decode + VAD done (ms, "
          "1 ms buckets, upper edges)\n")
    print(md_table(
        ["devices", "connected", "frames sent", "frames heard", "dropped", "lag p50", "lag p99", "lag max",
         "probe RTT p50", "probe RTT p99", "generator late p99", "CPU server / load gen", "verdict"],
        [row(s) for s in steps],
    ))  # fmt: skip
    print("\nframes heard: packets the sessions' hearing decoded and VAD-checked (sent − heard = packets of "
          "the final second or in flight at close).")
    print("CPU: share of one core over the step (2 cores = 200%); the load generator shares the cores.")
    for step in steps:
        if step.ignored or step.invalid:
            print(f"- {step.devices} devices: {step.ignored} packets ignored, {step.invalid} invalid")
    passing = [s.devices for s in steps if s.ok]
    best = max(passing, default=0)
    print()
    print(verdict(f"P2 ≥ {TARGET_DEVICES} devices with decode + VAD p99 ≤ {LAG_TARGET_MS:g} ms, none dropped",
                  best >= TARGET_DEVICES, f"largest passing step: {best} devices"))


async def run(bench: BenchServer, counts: list[int], duration: float) -> list[Step]:
    packets = speech_loop()
    steps: list[Step] = []
    for count in counts:
        if steps:
            bench.restart()
        step = Step(count)
        await run_step(bench, step, packets, duration)
        steps.append(step)
        print(f"  {count} devices: lag p99 {fmt(step.lag_percentile(0.99))} ms, dropped {step.dropped}", flush=True)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description="P2: streaming capacity")
    parser.add_argument("--devices", default="50,100,150,200", help="comma-separated device counts, one step each")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of streaming per step (≤ 26)")
    args = parser.parse_args()
    counts = [int(n) for n in args.devices.split(",") if n.strip()]
    persona = {**FAKE_PERSONA, "language": "en", "vad_min_silence_ms": SILENCE_WINDOW_MS, "greeting": ""}
    env = {"XIAOZHI_MAX_DEVICE_CONNECTIONS": str(max(counts) + 100), "XIAOZHI_IDLE_TIMEOUT_SECONDS": "3600",
           "XIAOZHI_HARD_TIMEOUT_SECONDS": "3600"}
    with BenchServer(persona=persona, env=env, prefix="p2-") as bench:
        steps = asyncio.run(run(bench, counts, min(args.duration, 26.0)))
    report(steps, min(args.duration, 26.0))


if __name__ == "__main__":
    main()
