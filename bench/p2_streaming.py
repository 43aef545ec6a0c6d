"""P2 — streaming capacity: N devices sending real-time 60 ms Opus uplink at once; every frame
decoded and VAD-checked within 60 ms of arrival (p99), none dropped. Target: N ≥ 200.

    .venv/bin/python bench/p2_streaming.py [--devices 50,100,150,200] [--duration 20]
        [--mix noise,dtx] [--servers daphne,uvicorn] [--workers N --redis redis://…/<db>] [--turn smart]
    .venv/bin/python bench/p2_streaming.py --overload --capacity C [--arrivals N] [--workers N --redis …]

For each N, a fresh server (daphne, same fresh SQLite database; `--workers N` workers on one
port linked by Redis, `--servers` one run per ASGI server) and N light devices
(bench/loadgen.py: firmware handshake, hello, MCP answers; no per-device threads; one clock task,
`Microphones`, writes every device's frames) that send
`listen start` (auto), at random moments over the first 2 s, and then stream a pre-encoded
loop of real espeak sentences and pauses (about 60% speech) on an absolute 60 ms clock, each
device from a random point of the loop and a random phase, for `--duration` seconds.
Mixes (`--mix`, one step per mix and N): "dtx", every device's pauses are the device's DTX
packets (1-3 bytes: a silent room); "noise" (the default), half the devices stream room
noise (pink noise and hum at about -52 dBFS, under the speech too) encoded at full rate
without DTX, as a device in a living room does, and the other half DTX.
The persona's silence window is set to 60 s so no utterance ends during a step: all N
devices stream all the time, and the server does nothing but hear (decode, VAD, endpointing,
speculative-ASR pauses with the instant fake ASR).

Server side, every session's hearing counts its packets and drops and keeps a histogram of
the lag from a packet's arrival in the session (`Hearing.push`, on the event loop) to the end
of the decode + VAD of the batch holding it (back on the event loop); it logs them as
"hearing stats" when the session closes (bench/server_settings.py writes them to a file).
What happens before `push` (kernel, daphne, Channels) is seen by a probe device sending a
repeated hello every 100 ms: its round trip is the event loop's responsiveness under load.
The load generator runs on the same two cores, without its garbage collector (bench/common.py
`generator_collector_off`); its own lateness is reported. Server CPU is reported per frame
heard: all server processes, and their event-loop (main) threads.

`--overload`: admission past capacity (conversations/admission.py). The server gets
XIAOZHI_MAX_STREAMING_SESSIONS = capacity / workers; 2 x capacity devices arrive over 10 s
(connect, hello, stream at once, as users pressing the button). The report shows how many
were admitted and refused (close code 1013, no retry here; the firmware retries), the
admitted devices' decode + VAD lag and dropped packets, the probe's round trip, the generator's
lateness, and the server's and the load generator's CPU over the 10 s of arrivals per device
arriving.
`--arrivals N` sends another number of devices: `--capacity 2 --arrivals 800` measures what a
refusal costs.
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from common import (
    FAKE_PERSONA, BenchServer, ServerMode, core_share, fmt, generator_collector_off, header, md_table, median,
    own_cpu_seconds, percentile, server_modes, steal_note, steal_seconds, verdict,
)
from loadgen import LightDevice, Microphones, mac_for, with_room_noise

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


ARRIVAL_S = 10.0  # --overload: devices arrive over this long
MIXES = ("dtx", "noise")


def speech_loop(noise: bool = False) -> list[bytes]:
    """~12 s of audio: each sentence followed by 0.6-1.2 s of pause, encoded as a device does:
    silent pauses become DTX packets; with `noise`, room noise runs under everything and the
    encoder sends full packets all the time."""
    pcm = b""
    for index, sentence in enumerate(SENTENCES):
        pcm += speak(sentence) + silence(16000, 600 + 200 * index)
    return opus_packets(with_room_noise(pcm), dtx=False) if noise else opus_packets(pcm)


@dataclass(frozen=True)
class Loops:
    dtx: list[bytes]
    noise: list[bytes]

    def for_device(self, index: int, mix: str) -> list[bytes]:
        return self.noise if mix == "noise" and index % 2 == 0 else self.dtx


@dataclass
class Step:
    devices: int
    mix: str = "dtx"
    mode: str = "daphne x1"
    sent: int = 0
    refused: int = 0  # 1013 at connect (--overload)
    refusals: dict[str, int] = field(default_factory=dict)
    connected: int = 0
    late_ms: list[float] = field(default_factory=list)  # generator lateness, sampled
    probe_ms: list[float] = field(default_factory=list)
    seconds: float = 0.0
    server_cpu: float = 0.0
    loop_cpu: float = 0.0
    arrivals_cpu: float = 0.0  # --overload: server CPU seconds over the arrivals
    arrivals_client_cpu: float = 0.0  # --overload: the load generator's CPU seconds over the arrivals
    client_cpu: float = 0.0
    steal: float = 0.0  # machine-wide CPU seconds the hypervisor gave to other guests
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
        return (self.connected + self.refused == self.devices and self.dropped == 0 and self.packets > 0
                and self.lag_percentile(0.99) <= LAG_TARGET_MS)

    def per_frame_us(self, seconds: float) -> str:
        return f"{seconds / self.packets * 1e6:.0f}" if self.packets else "-"


async def stream(device: LightDevice, mics: Microphones, packets: list[bytes], offset: int, start: float, end: float,
                 step: Step, sample: bool) -> None:
    """`listen start` just before `start`, then the loop of packets from `offset` until `end`."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, start - 0.05 - loop.time()))
    await device.listen_start("auto")
    await mics.start(device, packets, start, end, offset=offset, late=step.late_ms if sample else None).done


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


Meter = Callable[[], tuple[float, float, float, float]]  # CPU seconds: server, its event loops, load generator, steal


async def drive(url: str, step: Step, loops: Loops, duration: float, meter: Meter) -> list[LightDevice]:
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
    mics = Microphones()
    tasks = [  # users do not all press the button in the same millisecond
        stream(d, mics, loops.for_device(i, step.mix), rng.randrange(len(loops.dtx)),
               start + rng.uniform(0, START_SPREAD_S), end, step, i % 10 == 0)
        for i, d in enumerate(devices)
    ]
    started, before = time.perf_counter(), meter()  # the streaming only: not the connects and handshakes
    try:
        await asyncio.gather(probe(url, step, end), *tasks)
    finally:
        await mics.aclose()
    step.seconds = time.perf_counter() - started
    step.server_cpu, step.loop_cpu, step.client_cpu, step.steal = (b - a for a, b in zip(before, meter(), strict=True))
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


async def arrive(device: LightDevice, mics: Microphones, packets: list[bytes], offset: int, at: float, end: float,
                 step: Step, sample: bool) -> None:
    """--overload: connect at `at`, hello, and stream at once until `end`; a refusal is counted."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(max(0.0, at - loop.time()))
    try:
        await device.connect()
    except Exception as exc:  # noqa: BLE001 - no upgrade: the firmware gives up after 10 s and retries later
        timed_out = isinstance(exc.__cause__ or exc, TimeoutError)
        key = "no upgrade within 10 s (held: the firmware retries)" if timed_out else f"connect failed: {exc}"[:100]
        step.refusals[key] = step.refusals.get(key, 0) + 1
        return
    try:
        await device.hello()
    except Exception:  # noqa: BLE001 - refused (1013) or failed: counted below
        await asyncio.wait_for(device.closed.wait(), 5.0)
        key = f"{device.close_code} {device.close_reason}".strip() if device.close_code else "no close frame"
        step.refusals[key] = step.refusals.get(key, 0) + 1
        step.refused += device.close_code == 1013
        return
    step.connected += 1
    await stream(device, mics, packets, offset, loop.time() + 0.05, end, step, sample)


async def drive_overload(url: str, step: Step, loops: Loops, duration: float, meter: Meter) -> list[LightDevice]:
    rng = random.Random(step.devices)
    devices = [LightDevice(url, mac_for(0x400000 + i)) for i in range(step.devices)]
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5
    end = start + ARRIVAL_S + duration
    arrivals = sorted(rng.uniform(0, ARRIVAL_S) for _ in devices)
    mics = Microphones()
    tasks = [arrive(d, mics, loops.for_device(i, step.mix), rng.randrange(len(loops.dtx)), start + arrivals[i], end,
                    step, i % 10 == 0) for i, d in enumerate(devices)]
    started, before = time.perf_counter(), meter()

    async def meter_arrivals() -> None:
        await asyncio.sleep(max(0.0, start + ARRIVAL_S - loop.time()))
        now = meter()
        step.arrivals_cpu, step.arrivals_client_cpu = now[0] - before[0], now[2] - before[2]

    try:
        await asyncio.gather(probe(url, step, end), meter_arrivals(), *tasks)
    finally:
        await mics.aclose()
    step.seconds = time.perf_counter() - started
    step.server_cpu, step.loop_cpu, step.client_cpu, step.steal = (b - a for a, b in zip(before, meter(), strict=True))
    step.sent = sum(d.sent for d in devices)
    return devices


async def run_step(bench: BenchServer, step: Step, loops: Loops, duration: float, overload: bool = False) -> None:
    def meter() -> tuple[float, float, float, float]:
        return bench.cpu_seconds(), bench.loop_cpu_seconds(), own_cpu_seconds(), steal_seconds()

    devices = await (drive_overload if overload else drive)(bench.ws_url, step, loops, duration, meter)
    await asyncio.sleep(1.0)  # the last packets are heard before the sockets go
    await asyncio.gather(*(d.close() for d in devices))
    collect(step, await wait_for_stats(bench, step.connected + 1))  # + the probe's session


def row(step: Step) -> list[str]:
    return [
        step.mode, step.mix, str(step.devices), f"{step.connected}", str(step.sent), str(step.packets),
        str(step.dropped),
        fmt(step.lag_percentile(0.5)), fmt(step.lag_percentile(0.99)), fmt(step.lag_max_ms),
        fmt(median(step.probe_ms), 1), fmt(percentile(step.probe_ms, 0.99), 1),
        fmt(percentile(step.late_ms, 0.99), 1) if step.late_ms else "0.0",
        f"{core_share(step.server_cpu, step.seconds)} / {core_share(step.client_cpu, step.seconds)}",
        core_share(step.steal, step.seconds),
        f"{step.per_frame_us(step.server_cpu)} / {step.per_frame_us(step.loop_cpu)}",
        "PASS" if step.ok else "FAIL",
    ]


def report(steps: list[Step], duration: float) -> None:
    print(header("P2 — streaming capacity (real-time 60 ms Opus uplink, decode + VAD lag)"))
    print(f"{duration:g} s of streaming per step; lag = arrival in the session → decode + VAD done (ms, "
          "1 ms buckets, upper edges)\n")
    print(md_table(
        ["server", "mix", "devices", "connected", "frames sent", "frames heard", "dropped", "lag p50", "lag p99",
         "lag max", "probe RTT p50", "probe RTT p99", "generator late p99", "CPU server / load gen", "steal",
         "server µs per frame: all / event loops", "verdict"],
        [row(s) for s in steps],
    ))  # fmt: skip
    print("\nframes heard: packets the sessions' hearing decoded and VAD-checked (sent − heard = packets of "
          "the final second or in flight at close).")
    print("CPU: share of one core over the step (2 cores = 200%); the load generator shares the cores. "
          "µs per frame: server CPU over the step / frames heard (all processes; their main threads).")
    print(steal_note("step"))
    print("mix: dtx = every device's pauses are DTX packets; noise = half the devices stream room noise at full "
          "rate (no DTX), the other half DTX.")
    for step in steps:
        if step.ignored or step.invalid:
            print(f"- {step.devices} devices: {step.ignored} packets ignored, {step.invalid} invalid")
    passing = [s.devices for s in steps if s.ok]
    best = max(passing, default=0)
    print()
    print(verdict(f"P2 ≥ {TARGET_DEVICES} devices with decode + VAD p99 ≤ {LAG_TARGET_MS:g} ms, none dropped",
                  best >= TARGET_DEVICES, f"largest passing step: {best} devices"))


def overload_report(step: Step, capacity: int, workers: int, duration: float) -> None:
    print(header("P2 --overload — admission past capacity (new devices refused with 1013)"))
    print(f"capacity {capacity} streaming devices ({workers} worker(s), XIAOZHI_MAX_STREAMING_SESSIONS="
          f"{math.ceil(capacity / workers)} each); {step.devices} devices arrive over {ARRIVAL_S:g} s and stream "
          f"until {ARRIVAL_S + duration:g} s; mix {step.mix}\n")
    print(md_table(
        ["server", "devices", "admitted", "refused (1013)", "admitted lag p50", "admitted lag p99", "lag max",
         "dropped", "probe RTT p50", "probe RTT p99", "generator late p99 / max", "CPU server / load gen", "steal",
         "CPU in the arrivals, ms per device arriving: server / load gen"],
        [[step.mode, str(step.devices), str(step.connected), str(step.refused), fmt(step.lag_percentile(0.5)),
          fmt(step.lag_percentile(0.99)), fmt(step.lag_max_ms), str(step.dropped), fmt(median(step.probe_ms)),
          fmt(percentile(step.probe_ms, 0.99)),
          f"{fmt(percentile(step.late_ms, 0.99), 1)} / {fmt(max(step.late_ms), 1)}" if step.late_ms else "-",
          f"{core_share(step.server_cpu, step.seconds)} / {core_share(step.client_cpu, step.seconds)}",
          core_share(step.steal, step.seconds),
          f"{step.arrivals_cpu / step.devices * 1000:.2f} / {step.arrivals_client_cpu / step.devices * 1000:.2f}"]],
    ))  # fmt: skip
    print("\nclose codes seen at connect: " + (", ".join(f"{k}: {v}" for k, v in sorted(step.refusals.items()))
                                             or "none"))
    print(steal_note("step"))
    # `Step.ok`: also every device not admitted heard its 1013 (one left unanswered in the kernel's
    # queue past the firmware's 10 s is not refused, however good the lag).
    ok = step.refused > 0 and step.ok
    print()
    print(verdict(f"{step.devices / capacity:g}x capacity arriving: the admitted devices keep lag p99 ≤ "
                  f"{LAG_TARGET_MS:g} ms and nothing dropped, the rest are refused with 1013", ok,
                  f"admitted {step.connected}, refused {step.refused}, p99 {fmt(step.lag_percentile(0.99))} ms"))


async def run(modes: list[ServerMode], counts: list[int], mixes: list[str], duration: float,
              persona: dict[str, Any], env: dict[str, str]) -> list[Step]:
    loops = Loops(dtx=speech_loop(), noise=speech_loop(noise=True))
    steps = []
    for mode in modes:
        with BenchServer(persona=persona, env=env, prefix="p2-", server=mode.server, workers=mode.workers,
                         redis_url=mode.redis_url) as bench:
            first = True
            for mix in mixes:
                for count in counts:
                    if not first:
                        bench.restart()
                    first = False
                    step = Step(count, mix=mix, mode=mode.label)
                    await run_step(bench, step, loops, duration)
                    steps.append(step)
                    print(f"  {mode.label} {mix} {count} devices: lag p99 {fmt(step.lag_percentile(0.99))} ms, "
                          f"dropped {step.dropped}", flush=True)
    return steps


async def run_overload(mode: ServerMode, capacity: int, arrivals: int, mix: str, duration: float,
                       persona: dict[str, Any], env: dict[str, str]) -> Step:
    loops = Loops(dtx=speech_loop(), noise=speech_loop(noise=True))
    env = {**env, "XIAOZHI_MAX_STREAMING_SESSIONS": str(math.ceil(capacity / mode.workers))}
    with BenchServer(persona=persona, env=env, prefix="p2-", server=mode.server, workers=mode.workers,
                     redis_url=mode.redis_url) as bench:
        step = Step(arrivals, mix=mix, mode=mode.label)
        await run_step(bench, step, loops, duration, overload=True)
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description="P2: streaming capacity")
    parser.add_argument("--devices", default="50,100,150,200", help="comma-separated device counts, one step each")
    parser.add_argument("--turn", choices=("silence", "smart"), default="silence",
                        help="the persona's turn detection (smart: Smart Turn v3.2 on every pause of the speech)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of streaming per step (≤ 26)")
    parser.add_argument("--mix", default="noise", help="comma-separated: noise (half the devices stream room noise, "
                                                      "no DTX), dtx (all pauses DTX); one step per mix")
    parser.add_argument("--servers", default="daphne", help="comma-separated ASGI servers: daphne, uvicorn")
    parser.add_argument("--workers", type=int, default=1, help="web workers sharing the port (needs --redis if > 1)")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", ""),
                        help="Redis linking the workers (its database is flushed per server start)")
    parser.add_argument("--overload", action="store_true", help="admission: 2 x --capacity devices arrive")
    parser.add_argument("--capacity", type=int, default=100, help="--overload: streaming devices admitted in all")
    parser.add_argument("--arrivals", type=int, default=0, help="--overload: devices arriving (default 2 x --capacity)")
    args = parser.parse_args()
    counts = [int(n) for n in args.devices.split(",") if n.strip()]
    mixes = [m.strip() for m in args.mix.split(",") if m.strip()]
    if any(m not in MIXES for m in mixes):
        parser.error(f"--mix: one or more of {', '.join(MIXES)}")
    duration = min(args.duration, 26.0)
    modes = server_modes(args.servers, args.workers, args.redis)
    persona = {**FAKE_PERSONA, "language": "en", "vad_min_silence_ms": SILENCE_WINDOW_MS, "greeting": "",
               "turn_detection": args.turn}
    arrivals = args.arrivals or 2 * args.capacity
    top = arrivals if args.overload else max(counts)
    # The load's devices are unpaired (XIAOZHI_UNBOUND_POLICY=allow), so the cap on unpaired
    # sockets (200 per worker by default, docs/security.md) is lifted as P3 does: the steps
    # measure hearing capacity, and in the overload run admission alone refuses.
    env = {"XIAOZHI_MAX_DEVICE_CONNECTIONS": str(top + 100),
           "XIAOZHI_MAX_UNBOUND_DEVICE_CONNECTIONS": str(top + 100), "XIAOZHI_IDLE_TIMEOUT_SECONDS": "3600",
           "XIAOZHI_HARD_TIMEOUT_SECONDS": "3600"}
    generator_collector_off()
    if args.overload:  # admission as configured by default, plus the streaming limit
        step = asyncio.run(run_overload(modes[0], args.capacity, arrivals, mixes[0], duration, persona, env))
        overload_report(step, args.capacity, modes[0].workers, duration)
        return
    env["XIAOZHI_ADMISSION_MAX_LAG_MS"] = "0"  # capacity is what is measured: admit everyone
    steps = asyncio.run(run(modes, counts, mixes, duration, persona, env))
    report(steps, duration)


if __name__ == "__main__":
    main()
