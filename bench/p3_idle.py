"""P3 — idle capacity: N connected, hello'd, idle devices in ≤ 1 GB RSS of the server
process; hello round trip p99 ≤ 20 ms under that load.

    .venv/bin/python bench/p3_idle.py [--devices 2000] [--hold 10] [--probes 150]

Starts the real server (daphne) on a fresh SQLite database (open device auth, idle and hard
timeouts raised so nobody is sent away, the connection limit above N), then connects N light
devices (bench/loadgen.py: the firmware's handshake headers and hello with `"mcp": true`,
answering the server's MCP initialize and tools/list like the firmware does) and leaves them
idle. Measured:

- the server's RSS (VmRSS of the daphne process and any children, from /proc) before the
  first device, with N idle devices after the MCP exchanges settled, and its peak;
- hello round trips (hello sent → server hello received) of every device while ramping up;
- under the full load: `--probes` fresh devices, one after another, each connecting, saying
  hello (the P3 figure: what a device does when it opens its audio channel) and leaving;
  meanwhile 3 x `--probes` repeated hellos on random idle connections every 50 ms (the
  server answers a repeated hello without starting anything: the event loop's
  responsiveness);
- the server's CPU while N devices sit idle.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import time
from dataclasses import dataclass, field

from common import BenchServer, fmt, generator_collector_off, header, md_table, median, percentile, rss_bytes, verdict
from loadgen import LightDevice, mac_for

RSS_TARGET = 1024**3  # 1 GB (GiB)
HELLO_P99_TARGET_MS = 20.0
RAMP_CONCURRENCY = 25
MIB = 1024 * 1024


@dataclass
class Result:
    devices: int
    connected: int = 0
    failures: list[str] = field(default_factory=list)
    ramp_seconds: float = 0.0
    ramp_rtt_ms: list[float] = field(default_factory=list)  # in connection order
    fresh_rtt_ms: list[float] = field(default_factory=list)
    fresh_connect_ms: list[float] = field(default_factory=list)
    repeat_rtt_ms: list[float] = field(default_factory=list)
    rss_base: int = 0
    rss_idle: int = 0
    rss_peak: int = 0
    idle_cpu: float = 0.0  # share of one core while idle
    dropped_during_hold: int = 0


def raise_fd_limit(needed: int) -> None:
    """Sockets for every device, in this process and (inherited) in the server."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, needed)) if hard != resource.RLIM_INFINITY else max(soft, needed)
    if wanted > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


async def join(device: LightDevice, result: Result, rtts: list[float]) -> bool:
    try:
        await device.connect()
        rtts.append(await device.hello() * 1000)
        return True
    except Exception as exc:  # noqa: BLE001 - a refused or failed device is a result
        result.failures.append(f"{type(exc).__name__}: {exc}"[:200])
        await device.close()
        return False


async def ramp(url: str, result: Result) -> list[LightDevice]:
    devices = [LightDevice(url, mac_for(0x300000 + i)) for i in range(result.devices)]
    semaphore = asyncio.Semaphore(RAMP_CONCURRENCY)

    async def one(device: LightDevice) -> bool:
        async with semaphore:
            return await join(device, result, result.ramp_rtt_ms)

    started = time.perf_counter()
    joined = await asyncio.gather(*(one(d) for d in devices))
    result.ramp_seconds = time.perf_counter() - started
    return [d for d, ok in zip(devices, joined, strict=True) if ok]


async def settle(devices: list[LightDevice], timeout: float = 60.0) -> None:
    """Wait until the server has stopped talking MCP to the idle devices."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(d.mcp_pending or d.mcp_answered < 2 for d in devices):
        await asyncio.sleep(0.5)
    await asyncio.sleep(2.0)


async def fresh_probes(url: str, result: Result, count: int) -> None:
    for i in range(count):
        device = LightDevice(url, mac_for(0x3F0000 + i))
        started = time.perf_counter()
        try:
            await device.connect()
            result.fresh_connect_ms.append((time.perf_counter() - started) * 1000)
            result.fresh_rtt_ms.append(await device.hello() * 1000)
            await asyncio.sleep(0.2)  # answer the MCP handshake like a device, then leave
        except Exception as exc:  # noqa: BLE001
            result.failures.append(f"probe {type(exc).__name__}: {exc}"[:200])
        await device.close()
        await asyncio.sleep(0.1)


async def repeat_probes(devices: list[LightDevice], result: Result, count: int) -> None:
    rng = random.Random(3)
    for _ in range(count):
        device = rng.choice(devices)
        try:
            result.repeat_rtt_ms.append(await device.hello() * 1000)
        except Exception as exc:  # noqa: BLE001
            result.failures.append(f"repeat {type(exc).__name__}: {exc}"[:200])
        await asyncio.sleep(0.05)


async def sample_rss(pid: int, result: Result, stop: asyncio.Event) -> None:
    while not stop.is_set():
        result.rss_peak = max(result.rss_peak, rss_bytes(pid))
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
        except TimeoutError:
            pass


async def run(bench: BenchServer, args: argparse.Namespace) -> Result:
    result = Result(args.devices)
    await asyncio.sleep(1.0)
    result.rss_base = result.rss_peak = rss_bytes(bench.pid)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(bench.pid, result, stop))
    devices = await ramp(bench.ws_url, result)
    result.connected = len(devices)
    await settle(devices)
    result.rss_idle = rss_bytes(bench.pid)
    cpu, started = bench.cpu_seconds(), time.perf_counter()
    await asyncio.sleep(args.hold)
    result.idle_cpu = (bench.cpu_seconds() - cpu) / (time.perf_counter() - started)
    await asyncio.gather(fresh_probes(bench.ws_url, result, args.probes),
                         repeat_probes(devices, result, args.probes * 3))
    result.dropped_during_hold = sum(d.closed.is_set() for d in devices)
    stop.set()
    await sampler
    await asyncio.gather(*(d.close() for d in devices))
    return result


def rtt_row(name: str, values: list[float]) -> list[str]:
    return [name, str(len(values)), fmt(median(values), 2), fmt(percentile(values, 0.9), 2),
            fmt(percentile(values, 0.99), 2), fmt(max(values, default=float("nan")), 2)]


def report(result: Result) -> None:
    print(header(f"P3 — idle capacity ({result.devices} connected, hello'd, idle devices)"))
    per_device = (result.rss_idle - result.rss_base) / max(1, result.connected) / 1024
    print(md_table(["figure", "value"], [
        ["devices connected and hello'd", f"{result.connected} / {result.devices}"],
        ["ramp-up time (25 connecting at a time)", f"{result.ramp_seconds:.1f} s"],
        ["server RSS before the first device", f"{result.rss_base / MIB:.0f} MiB"],
        [f"server RSS with {result.connected} idle devices", f"{result.rss_idle / MIB:.0f} MiB"],
        ["server RSS peak (sampled every 0.5 s)", f"{result.rss_peak / MIB:.0f} MiB"],
        ["RSS per idle device", f"{per_device:.0f} KiB"],
        ["server CPU while idle (share of one core)", f"{result.idle_cpu * 100:.1f}%"],
        ["idle devices dropped by the server", str(result.dropped_during_hold)],
        ["failures", str(len(result.failures))],
    ], align="lr"))  # fmt: skip
    print("\nHello round trip (hello sent → server hello received), ms:\n")
    last = result.ramp_rtt_ms[-500:]
    print(md_table(["measurement", "n", "p50", "p90", "p99", "max"], [
        rtt_row("ramp-up, all devices", result.ramp_rtt_ms),
        rtt_row("ramp-up, last 500 devices", last),
        rtt_row("fresh device under full load (1 at a time)", result.fresh_rtt_ms),
        rtt_row("  its TCP + WebSocket handshake", result.fresh_connect_ms),
        rtt_row("repeated hello on an idle connection", result.repeat_rtt_ms),
    ]))  # fmt: skip
    for failure in sorted(set(result.failures))[:5]:
        print(f"- failure: {failure}")
    print()
    rss_ok = result.connected == result.devices and result.rss_peak <= RSS_TARGET
    print(verdict(f"P3 {result.devices} idle devices in ≤ 1 GiB RSS", rss_ok,
                  f"{result.connected} connected, RSS {result.rss_idle / MIB:.0f} MiB idle, "
                  f"{result.rss_peak / MIB:.0f} MiB peak"))
    p99 = percentile(result.fresh_rtt_ms, 0.99)
    print(verdict(f"P3 hello round trip p99 ≤ {HELLO_P99_TARGET_MS:g} ms under that load",
                  p99 <= HELLO_P99_TARGET_MS and result.connected == result.devices,
                  f"fresh devices p99 {fmt(p99, 2)} ms; repeated hellos p99 "
                  f"{fmt(percentile(result.repeat_rtt_ms, 0.99), 2)} ms"))


def main() -> None:
    parser = argparse.ArgumentParser(description="P3: idle capacity")
    parser.add_argument("--devices", type=int, default=2000, help="idle devices to connect")
    parser.add_argument("--hold", type=float, default=10.0, help="seconds of idling before the probes")
    parser.add_argument("--probes", type=int, default=150,
                        help="fresh devices probing one after another (and 3x as many repeated hellos)")
    parser.add_argument("--workers", type=int, default=1, help="web workers sharing the port (needs --redis if > 1)")
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", ""),
                        help="Redis linking the workers (its database is flushed per server start)")
    args = parser.parse_args()
    raise_fd_limit(args.devices * 2 + 1000)
    env = {
        "XIAOZHI_MAX_DEVICE_CONNECTIONS": str(args.devices + 100),
        # The benchmark's devices are not paired: lift the cap on unpaired sockets (200 per
        # worker, a protection against unauthenticated floods) so it measures idle capacity.
        "XIAOZHI_MAX_UNBOUND_DEVICE_CONNECTIONS": str(args.devices + 100),
        "XIAOZHI_IDLE_TIMEOUT_SECONDS": "3600", "XIAOZHI_HARD_TIMEOUT_SECONDS": "3600",
    }
    with BenchServer(env=env, prefix="p3-", workers=args.workers, redis_url=args.redis) as bench:
        generator_collector_off()
        result = asyncio.run(run(bench, args))
    report(result)


if __name__ == "__main__":
    main()
