"""A light device for load: the firmware's handshake, hello, MCP answers and Opus uplink, with
none of SimulatedDevice's per-device threads, encoders or decoders.

Hundreds or thousands of these share one asyncio loop. Uplink packets are encoded once
(`Utterance`) and replayed on an absolute 60 ms clock, exactly as a device streams its
microphone; downlink frames are only timestamped, not decoded. The handshake headers, the
hello and the device-side MCP server are the simulator's own (simulator/), so the
server sees what a real device sends.
"""
from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import json
import math
import time
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Frame, Opcode

from simulator import transport
from simulator.mcp_server import DeviceMcpServer
from testing.speech import opus_packets, silence, speak

FRAME_S = 0.06
RATE = 16000
FRAME_SAMPLES = RATE * 60 // 1000
SPEECH_RMS = 300.0  # s16 units (about -40 dBFS): a frame above this is speech


ROOM_NOISE_RMS = 80.0  # s16 units (about -52 dBFS): a quiet living room at the device's mic


def room_noise(ms: int, *, rms: float = ROOM_NOISE_RMS, seed: int = 7) -> bytes:
    """Room noise as 16 kHz s16 PCM: pink noise (1/f, like ventilation and traffic) with a faint
    mains hum. Encoded without DTX it stays full-size Opus packets, as a real room does."""
    rng = np.random.default_rng(seed)
    count = RATE * ms // 1000
    spectrum = np.fft.rfft(rng.standard_normal(count))
    freqs = np.fft.rfftfreq(count, 1 / RATE)
    spectrum[1:] /= np.sqrt(freqs[1:])  # white → pink
    spectrum[0] = 0
    noise = np.fft.irfft(spectrum, count)
    noise += 0.15 * np.sin(2 * np.pi * 100 * np.arange(count) / RATE) * noise.std()
    noise *= rms / noise.std()
    return np.clip(noise, -32768, 32767).astype("<i2").tobytes()


def with_room_noise(pcm: bytes, *, rms: float = ROOM_NOISE_RMS, seed: int = 7) -> bytes:
    """`pcm` with room noise under it, for the whole length (speech and pauses alike)."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    noise = np.frombuffer(room_noise(len(samples) * 1000 // RATE + 1, rms=rms, seed=seed), dtype="<i2")
    mixed = samples + noise[: len(samples)].astype(np.float32)
    return np.clip(mixed, -32768, 32767).astype("<i2").tobytes()


def mac_for(index: int, prefix: int = 0xBE) -> str:
    value = (prefix << 40) | index
    return ":".join(f"{(value >> shift) & 0xFF:02x}" for shift in range(40, -8, -8))


@dataclass(frozen=True)
class Utterance:
    """Pre-encoded uplink: lead-in silence, speech, then trailing silence (DTX packets, as a
    device sends them). `speech_end` is the index of the last packet holding speech."""

    packets: tuple[bytes, ...]
    speech_end: int

    @classmethod
    def spoken(cls, text: str, *, lead_ms: int = 300, tail_ms: int = 2000) -> Utterance:
        pcm = silence(RATE, lead_ms) + speak(text) + silence(RATE, tail_ms)
        packets = opus_packets(pcm)
        return cls(tuple(packets), last_speech_frame(pcm))

    @property
    def speech_packets(self) -> tuple[bytes, ...]:
        return self.packets[: self.speech_end + 1]

    @property
    def tail_packets(self) -> tuple[bytes, ...]:
        return self.packets[self.speech_end + 1 :]


def last_speech_frame(pcm: bytes) -> int:
    """Index of the last 60 ms frame whose RMS is above SPEECH_RMS."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
    count = len(samples) // FRAME_SAMPLES
    frames = samples[: count * FRAME_SAMPLES].reshape(count, FRAME_SAMPLES)
    loud = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > SPEECH_RMS)
    return int(loud[-1]) if len(loud) else 0


@dataclass
class Reply:
    """What the device saw of one answer (monotonic times; payloads if kept)."""

    tts_start: float | None = None
    tts_stop: float | None = None
    frames: list[float] = field(default_factory=list)
    payloads: list[bytes] = field(default_factory=list)


class LightDevice:
    """One device connection. `connect()`, `hello()`, then stream or idle; `close()`."""

    def __init__(self, ws_url: str, mac: str, *, mcp: bool = True, keep_audio: bool = False, token: str = "",
                 client_id: str | None = None, headers: dict[str, str] | None = None) -> None:
        self.ws_url = ws_url
        self.mac = mac
        self.token = token
        self.extra_headers = headers or {}
        self.client_id = client_id or str(uuid.uuid4())
        self.keep_audio = keep_audio
        self.features: dict[str, Any] = {"mcp": True} if mcp else {}
        self._mcp = DeviceMcpServer.default() if mcp else None
        if self._mcp is not None:
            self._mcp.device_id, self._mcp.client_id = mac, self.client_id
        self.ws: ClientConnection | None = None
        self.session_id = ""
        self.closed = asyncio.Event()
        self.speaking = False
        self.replies: list[Reply] = []
        self.sent = 0  # uplink packets
        self.mcp_answered = 0  # MCP requests of the server answered
        self.errors: list[str] = []
        self.close_code: int | None = None  # the server's close frame, if it sent one
        self.close_reason = ""
        self._hello: asyncio.Future[float] | None = None
        self._event = asyncio.Event()
        self._receiver: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- connection ---------------------------------------------------------------------------

    async def connect(self) -> None:
        headers = {**transport.handshake_headers(self.token, 1, self.mac, self.client_id), **self.extra_headers}
        self.ws = await transport.open_connection(self.ws_url, headers)
        self._receiver = asyncio.create_task(self._receive(self.ws))

    def hello_text(self) -> str:
        audio = {"format": "opus", "sample_rate": RATE, "channels": 1, "frame_duration": 60}
        return json.dumps({"type": "hello", "version": 1, "features": self.features, "transport": "websocket",
                           "audio_params": audio}, separators=(",", ":"))

    async def hello(self, timeout: float = 10.0) -> float:
        """Send the hello; return the round trip to the server hello in seconds."""
        assert self.ws is not None
        self._hello = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        await self.ws.send(self.hello_text())
        closed = asyncio.ensure_future(self.closed.wait())
        try:  # a refused socket (e.g. 1013) ends the wait at once, not at the timeout
            waiters: set[asyncio.Future[Any]] = {self._hello, closed}
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closed.cancel()
        if not self._hello.done():
            if self.closed.is_set():
                raise ConnectionError(f"closed before the hello: {self.close_code} {self.close_reason}")
            raise TimeoutError(f"no server hello within {timeout} s")
        return time.perf_counter() - started

    async def close(self) -> None:
        if self.ws is not None:
            transport.drop(self.ws)  # like the firmware: TCP gone, no close frame
        for task in [self._receiver, *self._tasks]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*[t for t in [self._receiver, *self._tasks] if t is not None], return_exceptions=True)

    # -- device → server ----------------------------------------------------------------------

    def _message(self, body: str) -> str:
        return '{"session_id":"' + self.session_id + '",' + body + "}"

    async def listen_start(self, mode: str = "auto") -> None:
        assert self.ws is not None
        await self.ws.send(self._message(f'"type":"listen","state":"start","mode":"{mode}"'))

    def write_packet(self, packet: bytes) -> bool:
        """One uplink frame (protocol v1: the bare Opus packet) written to the socket at once, as
        `Microphones` sends it (not through websockets' send: no lock, frame object or
        awaiting); False once the socket is gone."""
        transport = self.ws.transport if self.ws is not None else None
        if transport is None or self.closed.is_set() or transport.is_closing():
            return False
        transport.write(client_frame(packet))
        self.sent += 1
        return True

    async def stream(self, packets: list[bytes] | tuple[bytes, ...], start: float) -> float:
        """Send packets on the absolute clock start + n x 60 ms (loop time; `Microphones`);
        returns the loop time at which the last one was sent."""
        mic = Microphones.shared().start(self, packets, start, start + (len(packets) - 0.5) * FRAME_S)
        await mic.done
        return mic.last_sent or start

    async def stream_until(self, packets: list[bytes] | tuple[bytes, ...], start: float, stop: asyncio.Event) -> int:
        """Keep the mic streaming on the 60 ms clock until `stop` is set: `packets`, then the
        last of them again and again (DTX silence). Returns the number sent."""
        mic = Microphones.shared().start(self, packets, start, math.inf, hold_last=True)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((stopping, mic.done), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            mic.stop()
        return mic.index

    # -- server → device ----------------------------------------------------------------------

    async def _receive(self, ws: ClientConnection) -> None:
        try:
            async for message in ws:
                now = time.monotonic()
                if isinstance(message, str):
                    self._on_text(message, now)
                elif self.replies and self.speaking:
                    self.replies[-1].frames.append(now)
                    if self.keep_audio:
                        self.replies[-1].payloads.append(bytes(message))
                self._wake()
        except ConnectionClosed:
            pass
        except Exception as exc:  # noqa: BLE001 - record, never crash the load
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            received = ws.protocol.close_rcvd  # the server's close frame (ClientConnection has no close_rcvd)
            if received is not None:
                self.close_code, self.close_reason = received.code, received.reason
            self.closed.set()
            self._wake()

    def _wake(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def _on_text(self, text: str, now: float) -> None:
        data = json.loads(text)
        kind = data.get("type")
        if kind == "hello":
            self.session_id = str(data.get("session_id") or "")
            if self._hello is not None and not self._hello.done():
                self._hello.set_result(now)
        elif kind == "tts" and data.get("state") == "start":
            self.speaking = True
            self.replies.append(Reply(tts_start=now))
        elif kind == "tts" and data.get("state") == "stop":
            self.speaking = False
            if self.replies:
                self.replies[-1].tts_stop = now
        elif kind == "mcp" and self._mcp is not None:
            task = asyncio.create_task(self._answer_mcp(data.get("payload")))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer_mcp(self, payload: Any) -> None:
        assert self._mcp is not None and self.ws is not None
        reply = await self._mcp.handle(payload)
        if reply is not None and not self.closed.is_set():
            try:
                await self.ws.send(self._message('"type":"mcp","payload":' + reply))
                self.mcp_answered += 1
            except ConnectionClosed:
                pass

    @property
    def mcp_pending(self) -> bool:
        return bool(self._tasks)

    async def wait(self, predicate: Any, timeout: float) -> bool:
        """Wait until predicate() is true (re-checked on every incoming message)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.closed.is_set():
                return bool(predicate())
            try:
                await asyncio.wait_for(self._event.wait(), remaining)
            except TimeoutError:
                pass
        return True


@functools.lru_cache(maxsize=4096)
def client_frame(payload: bytes) -> bytes:
    """A device's binary frame for `payload` (FIN, opcode 2, masked), built by websockets once
    per distinct packet: the benchmarks replay a few hundred pre-encoded packets, so each keeps
    the random mask it was first given (a load generator need not hide from proxies)."""
    return Frame(Opcode.BINARY, payload).serialize(mask=True)


@dataclass
class Microphone:
    """One device's stream on a `Microphones` clock."""

    device: LightDevice
    packets: Sequence[bytes]
    offset: int
    end: float
    late: list[float] | None  # lateness samples (ms), if wanted
    done: asyncio.Future[int]  # the number sent, once the stream is over
    hold_last: bool = False  # after the packets, the last one again and again (DTX silence)
    index: int = 0  # packets sent
    last_sent: float = 0.0  # loop time of the last one

    def stop(self) -> None:
        """End the stream now (nothing more is sent)."""
        if not self.done.done():
            self.done.set_result(self.index)


class Microphones:
    """Every streaming device's 60 ms uplink clock in one task.

    A task per device sleeping for each frame, then websockets' send (its lock, a frame object,
    a fresh mask) cost this generator ~80 µs of CPU a frame on the Zen 3 machine: ~40 % of a
    core at 300 devices, on the two cores it shares with the server (P2). Here one task sleeps
    until the next frame due, then writes every due device's frame (`write_packet`: one
    socket write each). The frames are the same bytes on the same absolute clock. P2 makes its
    own; `LightDevice.stream` and `stream_until` (a turn in P1 and P5) share the loop's."""

    # At most one round of sends per `grain_s`: the frames due meanwhile go together, up to
    # this late (a device's own send timing varies more). Waking for every frame due (~0.2 ms
    # apart at 300 devices) spent half this generator's CPU in the event loop's polling.
    grain_s = 0.004
    _shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Microphones] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self._woke = 0.0  # loop time of the last round of sends
        self._due: list[tuple[float, int, Microphone]] = []  # a heap: (when, tie-break, microphone)
        self._order = itertools.count()
        self._alarm: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def shared(cls) -> Microphones:
        """The running loop's clock, for `LightDevice.stream` and `stream_until` (its task
        ends whenever no stream is left)."""
        loop = asyncio.get_running_loop()
        if loop not in cls._shared:
            cls._shared[loop] = cls()
        return cls._shared[loop]

    def start(self, device: LightDevice, packets: Sequence[bytes], start: float, end: float, *,
              offset: int = 0, late: list[float] | None = None, hold_last: bool = False) -> Microphone:
        """Send packets[offset], packets[offset + 1], … (round the loop; `hold_last`: the last
        one again) at start + n × 60 ms (loop time) until `end`, the socket goes or the handle
        is stopped; its `done` gives the number sent."""
        loop = asyncio.get_running_loop()
        mic = Microphone(device, packets, offset, end, late, loop.create_future(), hold_last)
        earliest = self._due[0][0] if self._due else None
        heapq.heappush(self._due, (start, next(self._order), mic))
        if self._task is None:
            self._task = loop.create_task(self._run())
        elif earliest is None or start < earliest:
            self._ring()
        return mic

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for _when, _order, mic in self._due:
            mic.stop()

    def _ring(self) -> None:
        if self._alarm is not None and not self._alarm.done():
            self._alarm.set_result(None)

    async def _run(self) -> None:
        try:
            await self._send_until_none_left()
        finally:
            self._task = None

    async def _send_until_none_left(self) -> None:
        loop = asyncio.get_running_loop()
        while self._due:
            if self._due[0][0] > loop.time():
                await self._sleep(max(self._due[0][0], self._woke + self.grain_s))
                continue
            now = self._woke = loop.time()
            while self._due and self._due[0][0] <= now:
                when, order, mic = heapq.heappop(self._due)
                if self._send(mic, when, now):
                    heapq.heappush(self._due, (when + FRAME_S, order, mic))

    async def _sleep(self, until: float) -> None:
        loop = asyncio.get_running_loop()
        self._alarm = loop.create_future()
        timer = loop.call_at(until, self._ring)
        try:
            await self._alarm
        finally:
            timer.cancel()

    @staticmethod
    def _send(mic: Microphone, when: float, now: float) -> bool:
        """One frame of `mic`; False when its stream is over."""
        if mic.done.done():  # stopped
            return False
        packets, index = mic.packets, mic.offset + mic.index
        packet = packets[min(index, len(packets) - 1)] if mic.hold_last else packets[index % len(packets)]
        if when >= mic.end or not mic.device.write_packet(packet):
            mic.stop()
            return False
        if mic.late is not None:
            mic.late.append((now - when) * 1000)
        mic.index += 1
        mic.last_sent = now
        return True


def playout_end(frames: list[float]) -> float:
    """When the device's speaker finishes the frames (60 ms each, queued in arrival order)."""
    end = 0.0
    for at in frames:
        end = max(end, at) + FRAME_S
    return end


async def talk(device: LightDevice, utterance: Utterance, timeout: float = 15.0) -> tuple[float, Reply] | None:
    """One user turn in auto mode, as the firmware does it: `listen start`, the speech in real
    time, DTX silence until `tts start` (then the mic is off), wait for `tts stop` and the
    local playout. Returns (loop time the last speech packet was sent, the reply), or None
    if no reply started within `timeout`."""
    loop = asyncio.get_running_loop()
    before = len(device.replies)
    await device.listen_start()
    start = loop.time()
    last_speech = await device.stream(utterance.speech_packets, start)
    stop = asyncio.Event()
    tail_start = start + len(utterance.speech_packets) * FRAME_S
    mic = asyncio.create_task(device.stream_until(utterance.tail_packets, tail_start, stop))
    answered = await device.wait(lambda: len(device.replies) > before, timeout)
    stop.set()
    await mic
    if not answered:
        return None
    reply = device.replies[-1]
    await device.wait(lambda: reply.tts_stop is not None, max(timeout, 120.0))
    await asyncio.sleep(max(0.0, playout_end(reply.frames) - time.monotonic()))
    return last_speech, reply
