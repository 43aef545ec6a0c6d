"""P10 — reboot storm: after a power cut a whole fleet checks in at once, then connects.

    .venv/bin/python bench/p10_ota_storm.py [--devices 5000] [--window 30] [--calm 200]
        [--workers N --redis redis://…/<db>] [--servers daphne] [--breakdown RATE]

A fresh server (bench/common.py) with token authentication, as in production, and a fleet of
N bound devices created in its database. Every device comes from its own address
(X-Forwarded-For, with XIAOZHI_TRUSTED_PROXY_COUNT=1), so per-address rate limits apply as
they would to a real fleet. Phases:

1. **first check-in**: every device checks in once (its row learns its board, firmware,
   address: the check-in that writes), 100 at a time; not a target, reported.
2. **calm**: `--calm` check-ins one after the other by devices the server knows, nothing
   changed: the OTA round trip of one device on an idle server (target p50 ≤ 10 ms).
   Then one device connects once, so the server stores its firmware's tool list, and every
   row of the fleet gets that list: the fleet was online before the power cut, and a
   reconnecting device's unchanged list is not written again (`--first-connect`: a fleet that
   never connected, every list new and written).
3. **storm**: each of the N devices checks in at a random moment within `--window` seconds
   (the OTA POST the firmware sends at boot: its body and headers, a new connection each),
   then opens its WebSocket with the token from the reply, says hello and answers the
   server's MCP handshake, as the firmware does. Targets: 0 errors, OTA p99 ≤ 1 s; the
   hello round trip is reported.

Errors: any OTA answer other than 200 with a token, any failed connect or hello (close codes
counted). The load generator shares the machine's cores; its CPU is reported. Its timeouts are
the firmware's: 30 s for the OTA check, 10 s for the WebSocket upgrade and for the server hello.

`--breakdown RATE` replaces the storm with the cost of its parts: every device checks in
(nothing changed), then every device connects, says hello and answers the MCP handshake, then
every device drops its connection (until the server holds none online), each kind paced at RATE
per second (below capacity), and the server CPU per device is printed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

from common import (
    BASE_DIR, BenchServer, core_share, fmt, generator_collector_off, header, md_table, median, own_cpu_seconds,
    percentile, server_modes, steal_note, steal_seconds, verdict,
)
from loadgen import LightDevice, mac_for

from simulator.ota import Identity, request_headers, system_info

OTA_P50_TARGET_MS = 10.0
OTA_P99_TARGET_MS = 1000.0
OTA_PATH = "/xiaozhi/ota/"
# The firmware's own limits (docs: protocol-reference §8 and esp-ml307's HttpClient): an OTA
# check gives up after 30 s, the WebSocket upgrade after 10 s (simulator/transport.py), and the
# server hello must arrive within 10 s of the device's hello.
OTA_TIMEOUT_S = 30.0
HELLO_TIMEOUT_S = 10.0
FIRST_CONCURRENCY = 100
T = TypeVar("T")
Item = TypeVar("Item")


@dataclass
class Phase:
    name: str
    ota_ms: list[float] = field(default_factory=list)
    hello_ms: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    steal: float = 0.0  # machine-wide CPU seconds the hypervisor gave to other guests
    closed: int = 0  # devices that disconnected in the phase (the breakdown's last)

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())


@dataclass(frozen=True)
class Member:
    index: int
    mac: str
    client_id: str

    @property
    def address(self) -> str:
        return f"10.{(self.index >> 16) & 255}.{(self.index >> 8) & 255}.{self.index & 255}"

    def identity(self) -> Identity:
        return Identity(mac=self.mac, client_id=self.client_id, board="bread-compact-wifi",
                        firmware_version="2.4.2", language="zh-CN", serial_number=None)


def fleet(count: int) -> list[Member]:
    return [Member(i, mac_for(0x500000 + i), f"00000000-0000-4000-8000-{i:012d}") for i in range(count)]


def create_fleet(bench: BenchServer, members: list[Member]) -> None:
    """N bound devices (one owner) in the server's database, in one transaction."""
    code = (
        "import json, os; from django.contrib.auth import get_user_model; from django.utils import timezone; "
        "from devices.models import Device; "
        "owner = get_user_model().objects.create_user('fleet-owner'); now = timezone.now(); "
        "Device.objects.bulk_create([Device(mac=m, client_id=c, owner=owner, bound_at=now) "
        "for m, c in json.load(open(os.environ['BENCH_FLEET']))], batch_size=1000)"
    )
    # A file, not the environment: one variable is limited to 128 KiB (5,000 devices are ~300 KiB).
    path = bench.data_dir / "fleet.json"
    path.write_text(json.dumps([[m.mac, m.client_id] for m in members]))
    env = {**os.environ, **bench.env(), "BENCH_FLEET": str(path)}
    subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=BASE_DIR, env=env, check=True)


async def learn_tool_lists(bench: BenchServer, members: list[Member]) -> None:
    """A reboot storm's fleet was online before the power cut, so each row holds the tool list
    its firmware reports (the server writes it again only when it changes). One device checks
    in and connects once, so the server stores the list as it would; the fleet, all on one
    firmware, then gets the same list."""
    phase = Phase("learning the tool list")
    first = members[0]
    token = await check_in(bench.http_url + OTA_PATH, first, phase)
    if token is None:
        raise SystemExit(f"the tool list could not be learnt: {phase.errors}")
    device = LightDevice(bench.ws_url, first.mac, token=token, client_id=first.client_id,
                         headers={"X-Forwarded-For": first.address})
    await device.connect()
    await device.hello(timeout=HELLO_TIMEOUT_S)
    if not await device.wait(lambda: device.mcp_answered >= 2, timeout=HELLO_TIMEOUT_S):
        raise SystemExit("the tool list could not be learnt: MCP handshake unfinished")
    code = (
        "import time; from devices.models import Device; "
        "mac = __import__('os').environ['BENCH_FIRST']; deadline = time.monotonic() + 10\n"
        "while not Device.objects.get(mac=mac).mcp_tools and time.monotonic() < deadline: time.sleep(0.1)\n"
        "row = Device.objects.get(mac=mac); assert row.mcp_tools, 'no tool list stored'\n"
        "Device.objects.filter(owner=row.owner).update(mcp_server_info=row.mcp_server_info, "
        "mcp_tools=row.mcp_tools, mcp_tools_updated_at=row.mcp_tools_updated_at)"
    )
    env = {**os.environ, **bench.env(), "BENCH_FIRST": first.mac}
    await asyncio.to_thread(subprocess.run, [sys.executable, "manage.py", "shell", "-c", code], cwd=BASE_DIR,
                            env=env, check=True)
    await device.close()


class OtaExchange(asyncio.Protocol):
    """One OTA POST on a connection of its own, as the firmware's HTTP client makes it: the
    request written at once, the reply read to its Content-Length, the connection closed.

    Written on asyncio's protocol layer rather than with aiohttp: the generator shares the
    server's two cores, and aiohttp's client cost ~3.2 ms of CPU per check (session 41's
    machine), close to half of what the server spends answering it. The bytes sent are the
    same (the firmware's headers and body, no Accept or Accept-Encoding)."""

    def __init__(self, request: bytes, done: asyncio.Future[tuple[int, bytes]]) -> None:
        self.request = request
        self.done = done
        self.buffer = bytearray()
        self.status = 0
        self.body_at = -1  # where the body starts, once the head has arrived
        self.length = -1  # Content-Length (-1: read until the server closes)
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        cast(asyncio.Transport, transport).write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.body_at < 0 and not self._head():
            return
        if 0 <= self.length <= len(self.buffer) - self.body_at:
            self._finish(bytes(self.buffer[self.body_at:self.body_at + self.length]))

    def _head(self) -> bool:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return False
        lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
        self.status = int(lines[0].split(" ", 2)[1])
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                self.length = int(value)
        self.body_at = end + 4
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.body_at >= 0 and self.length < 0:
            self._finish(bytes(self.buffer[self.body_at:]))
        elif not self.done.done():
            self.done.set_exception(ConnectionError(f"connection closed before the reply ({exc})"))

    def _finish(self, body: bytes) -> None:
        if not self.done.done():
            self.done.set_result((self.status, body))
        if self.transport is not None:
            self.transport.close()


def ota_request(url: str, member: Member) -> tuple[str, int, bytes]:
    """Host, port and the bytes of `member`'s OTA POST to `url` (http://host:port/path)."""
    address, _, path = url.removeprefix("http://").partition("/")
    host, _, port = address.partition(":")
    identity = member.identity()
    body = json.dumps(system_info(identity)).encode()
    headers = {"Host": address, **request_headers(identity), "X-Forwarded-For": member.address,
               "Content-Length": str(len(body))}
    head = f"POST /{path} HTTP/1.1\r\n" + "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    return host, int(port or 80), head.encode("latin-1") + b"\r\n" + body


async def ota_post(url: str, member: Member) -> tuple[int, bytes]:
    """The status and body of one OTA POST; TimeoutError after the firmware's 30 s, OSError when
    the connection fails."""
    host, port, request = ota_request(url, member)
    loop = asyncio.get_running_loop()
    done: asyncio.Future[tuple[int, bytes]] = loop.create_future()
    transport = None
    try:
        async with asyncio.timeout(OTA_TIMEOUT_S):
            transport, _ = await loop.create_connection(lambda: OtaExchange(request, done), host, port)
            return await done
    finally:
        if transport is not None:
            transport.close()


async def check_in(url: str, member: Member, phase: Phase) -> str | None:
    """One OTA check like the firmware's; returns the token, or None (an error is counted)."""
    started = time.perf_counter()
    try:
        status, body = await ota_post(url, member)
    except (OSError, TimeoutError) as exc:
        phase.error(f"OTA {type(exc).__name__}")
        return None
    phase.ota_ms.append((time.perf_counter() - started) * 1000)
    if status != 200:
        phase.error(f"OTA HTTP {status}")
        return None
    token = json.loads(body).get("websocket", {}).get("token", "")
    if not token:
        phase.error("OTA without a token")
        return None
    return str(token)


def failure(device: LightDevice, exc: Exception) -> str:
    """The server's close code and reason when it sent one, else the exception's name. A close
    frame that arrives while the hello is being sent ends in ConnectionClosedError before the
    receiver has recorded it: its code is on the exception. Otherwise the exception, with its
    message (a refused upgrade's HTTP status, a timeout)."""
    received = getattr(exc, "rcvd", None)
    code = device.close_code or getattr(received, "code", None)
    reason = device.close_reason or getattr(received, "reason", "")
    if code:
        return f"{code} {reason}"
    detail = str(exc).replace(device.ws_url, "<url>")[:120]  # e.g. the HTTP status of a refused upgrade
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


async def first_check_ins(url: str, members: list[Member], phase: Phase) -> None:
    gate = asyncio.Semaphore(FIRST_CONCURRENCY)

    async def one(member: Member) -> None:
        async with gate:
            await check_in(url, member, phase)

    await asyncio.gather(*(one(member) for member in members))


async def calm(url: str, members: list[Member], phase: Phase) -> None:
    for member in members:
        await check_in(url, member, phase)


async def storm(url: str, ws_url: str, members: list[Member], window: float, phase: Phase) -> list[LightDevice]:
    rng = random.Random(len(members))
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.5
    devices: list[LightDevice] = []

    async def boot(member: Member, at: float) -> None:
        await asyncio.sleep(max(0.0, at - loop.time()))
        token = await check_in(url, member, phase)
        if token is None:
            return
        device = LightDevice(ws_url, member.mac, token=token, client_id=member.client_id,
                             headers={"X-Forwarded-For": member.address})
        devices.append(device)
        try:
            await device.connect()
            phase.hello_ms.append(await device.hello(timeout=HELLO_TIMEOUT_S) * 1000)
        except Exception as exc:  # noqa: BLE001 - counted, the storm goes on
            reason = failure(device, exc)
            phase.error(f"connect/hello: {reason}")

    await asyncio.gather(*(boot(m, start + rng.uniform(0, window)) for m in members))
    return devices


async def paced(items: Sequence[Item], rate: float, work: Callable[[Item], Awaitable[object]]) -> None:
    """`work` for each item, started at `rate` per second (below capacity: the CPU per request)."""
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.2

    async def one(index: int, item: Item) -> None:
        await asyncio.sleep(max(0.0, start + index / rate - loop.time()))
        await work(item)

    await asyncio.gather(*(one(index, item) for index, item in enumerate(items)))


async def breakdown(bench: BenchServer, members: list[Member], rate: float) -> list[Phase]:
    """The server CPU of one check-in (nothing changed), of one connect + hello + MCP handshake
    and of one disconnect (the session closed, the device marked offline), each kind alone and
    paced below capacity."""
    url = bench.http_url + OTA_PATH
    checks, connects = Phase(f"paced check-ins, {rate:g}/s"), Phase(f"paced connects + hello + MCP, {rate:g}/s")
    closes = Phase(f"paced disconnects, {rate:g}/s")
    tokens: dict[str, str] = {}
    devices: list[LightDevice] = []

    async def check(member: Member) -> None:
        token = await check_in(url, member, checks)
        if token is not None:
            tokens[member.mac] = token

    async def connect(member: Member) -> None:
        device = LightDevice(bench.ws_url, member.mac, token=tokens[member.mac], client_id=member.client_id,
                             headers={"X-Forwarded-For": member.address})
        devices.append(device)
        try:
            await device.connect()
            connects.hello_ms.append(await device.hello(timeout=HELLO_TIMEOUT_S) * 1000)
            if not await device.wait(lambda: device.mcp_answered >= 2, timeout=HELLO_TIMEOUT_S):
                connects.error("MCP handshake unfinished")
        except Exception as exc:  # noqa: BLE001 - counted, the run goes on
            reason = failure(device, exc)
            connects.error(f"connect/hello: {reason}")

    await measured(bench, checks, paced(members, rate, check))
    await asyncio.sleep(1.0)
    await measured(bench, connects, paced([m for m in members if m.mac in tokens], rate, connect))
    await asyncio.sleep(1.0)
    await measured(bench, closes, disconnect(bench, devices, rate, closes))
    return [checks, connects, closes]


async def disconnect(bench: BenchServer, devices: list[LightDevice], rate: float, phase: Phase) -> None:
    """Drop each device's TCP connection, as the firmware does, at `rate` per second; the phase
    ends when the server has marked every one offline (or after 10 s more)."""
    async def close(device: LightDevice) -> None:
        await device.close()
        phase.closed += 1

    await paced(devices, rate, close)
    deadline = time.monotonic() + 10.0
    while (online := await asyncio.to_thread(online_devices, bench)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if online:
        phase.error(f"{online} devices still online 10 s after their disconnect")


def online_devices(bench: BenchServer) -> int:
    """Devices the server's database holds online (read from its SQLite file)."""
    with sqlite3.connect(f"file:{bench.db_path}?mode=ro", uri=True, timeout=5) as db:
        return int(db.execute("SELECT COUNT(*) FROM devices_device WHERE is_online").fetchone()[0])


async def measured(bench: BenchServer, phase: Phase, work: Awaitable[T]) -> T:
    cpu, client, steal, started = bench.cpu_seconds(), own_cpu_seconds(), steal_seconds(), time.perf_counter()
    result = await work
    phase.seconds = time.perf_counter() - started
    phase.server_cpu, phase.client_cpu = bench.cpu_seconds() - cpu, own_cpu_seconds() - client
    phase.steal = steal_seconds() - steal
    return result


async def run(bench: BenchServer, members: list[Member], window: float, calm_count: int,
              breakdown_rate: float, first_connect: bool = False) -> list[Phase]:
    url = bench.http_url + OTA_PATH
    phases = [Phase("first check-in (writes)"), Phase("calm: one device at a time")]
    await measured(bench, phases[0], first_check_ins(url, members, phases[0]))
    print(f"  first check-in: {len(phases[0].ota_ms)} answered, {phases[0].error_count} errors", flush=True)
    if not first_connect:
        await learn_tool_lists(bench, members)
    await measured(bench, phases[1], calm(url, members[:calm_count], phases[1]))
    print(f"  calm: OTA p50 {fmt(median(phases[1].ota_ms), 2)} ms", flush=True)
    if breakdown_rate:
        return phases + await breakdown(bench, members, breakdown_rate)
    phases.append(Phase("storm"))
    devices = await measured(bench, phases[2], storm(url, bench.ws_url, members, window, phases[2]))
    print(f"  storm: {len(phases[2].ota_ms)} OTA answers, {phases[2].error_count} errors", flush=True)
    await asyncio.gather(*(d.close() for d in devices))
    return phases


def report_breakdown(phases: list[Phase]) -> None:
    """Server CPU per device: every server process, over the phase, divided by its devices."""
    for phase in phases:
        count = phase.closed or len(phase.hello_ms) or len(phase.ota_ms)
        per = 1000 * phase.server_cpu / count if count else float("nan")
        client = 1000 * phase.client_cpu / count if count else float("nan")
        print(f"- {phase.name}: server CPU {per:.2f} ms per device (load generator {client:.2f} ms)")


def report(phases: list[Phase], devices: int, window: float, mode: str, breakdown_rate: float = 0.0) -> None:
    print(header("P10 — reboot storm (OTA check-in, then connect)"))
    shape = f"paced at {breakdown_rate:g}/s" if breakdown_rate else f"storm: all within {window:g} s"
    print(f"{devices} bound devices, each from its own address; {shape}; server {mode}\n")
    rows = []
    for phase in phases:
        rows.append([
            phase.name, str(len(phase.ota_ms)), fmt(median(phase.ota_ms), 2), fmt(percentile(phase.ota_ms, 0.9), 1),
            fmt(percentile(phase.ota_ms, 0.99), 1), fmt(max(phase.ota_ms, default=float("nan")), 1),
            str(len(phase.hello_ms)) if phase.hello_ms else "-",
            fmt(median(phase.hello_ms), 1) if phase.hello_ms else "-",
            fmt(percentile(phase.hello_ms, 0.99), 1) if phase.hello_ms else "-",
            str(phase.error_count), f"{phase.seconds:.1f}",
            f"{core_share(phase.server_cpu, phase.seconds)} / {core_share(phase.client_cpu, phase.seconds)}",
            core_share(phase.steal, phase.seconds),
        ])
    print(md_table(["phase", "OTA answers", "OTA p50 ms", "p90", "p99", "max", "hellos", "hello p50 ms", "hello p99",
                    "errors", "seconds", "CPU server / load gen", "steal"], rows))
    print("\nCPU: share of one core over the phase (2 cores = 200%); the load generator shares the cores. "
          + steal_note("phase"))
    for phase in phases:
        if phase.errors:
            print(f"- {phase.name} errors: " + ", ".join(f"{k}: {v}" for k, v in sorted(phase.errors.items())))
    calm_phase = phases[1]
    print()
    print(verdict(f"OTA check-in p50 ≤ {OTA_P50_TARGET_MS:g} ms (calm)", median(calm_phase.ota_ms) <= OTA_P50_TARGET_MS,
                  f"p50 {fmt(median(calm_phase.ota_ms), 2)} ms"))
    if breakdown_rate:
        report_breakdown(phases[2:])
        return
    storm_phase = phases[2]
    ok = storm_phase.error_count == 0 and percentile(storm_phase.ota_ms, 0.99) <= OTA_P99_TARGET_MS
    print(verdict(f"storm of {devices} in {window:g} s: 0 errors, OTA p99 ≤ {OTA_P99_TARGET_MS:g} ms", ok,
                  f"{storm_phase.error_count} errors, p99 {fmt(percentile(storm_phase.ota_ms, 0.99), 1)} ms"))


def main() -> None:
    parser = argparse.ArgumentParser(description="P10: reboot storm")
    parser.add_argument("--devices", type=int, default=5000)
    parser.add_argument("--window", type=float, default=30.0, help="seconds over which the fleet checks in")
    parser.add_argument("--calm", type=int, default=200, help="check-ins one at a time for the calm p50")
    parser.add_argument("--servers", default="daphne")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--redis", default=os.environ.get("REDIS_URL", ""))
    parser.add_argument("--first-connect", action="store_true",
                        help="a fleet that never connected: every device's tool list is new and written "
                             "(by default the fleet rows hold their firmware's list, as after a power cut)")
    parser.add_argument("--breakdown", type=float, default=0.0, metavar="RATE",
                        help="instead of the storm: check-ins, then connects, paced at RATE per second, "
                             "and the server CPU each one costs")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 3 * args.devices + 1000  # sockets here and (inherited) in the server
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted) if hard != resource.RLIM_INFINITY else wanted,
                                                    hard))
    members = fleet(args.devices)
    mode = server_modes(args.servers, args.workers, args.redis)[0]
    env = {"XIAOZHI_WS_AUTH": "token", "XIAOZHI_TRUSTED_PROXY_COUNT": "1",
           "XIAOZHI_MAX_DEVICE_CONNECTIONS": str(args.devices + 100),
           "XIAOZHI_IDLE_TIMEOUT_SECONDS": "3600", "XIAOZHI_HARD_TIMEOUT_SECONDS": "3600"}
    with BenchServer(env=env, prefix="p10-", server=mode.server, workers=mode.workers,
                     redis_url=mode.redis_url) as bench:
        create_fleet(bench, members)
        generator_collector_off()
        phases = asyncio.run(run(bench, members, args.window, min(args.calm, args.devices), args.breakdown,
                                 args.first_connect))
    report(phases, args.devices, args.window, mode.label + (", first connect" if args.first_connect else ""),
           args.breakdown)


if __name__ == "__main__":
    main()
