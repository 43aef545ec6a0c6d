"""The device's downlink audio path (protocol-reference §2.3, §4.1), as a measurable model.

Audio is accepted only while the device is `speaking` (OnIncomingAudio drops the rest),
decoded at the rate/frame duration of the server hello (packets longer than the announced
frame fail, like the firmware's fixed PCM buffer), and "played" in real time through the
40-packet decode queue: a frame arriving while 40 are still waiting is dropped (overflow),
a frame arriving after the queue ran dry is a gap (underrun).

Played frames feed the server-AEC timestamp queue (`stamps`, echo.py) and, when the device
has an echo path (`echo`), the room's echo that its microphone picks up.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from devices.protocol.binary import decode_audio
from devices.protocol.errors import ProtocolError
from devices.protocol.opus import AudioError, OpusDecoder
from simulator.echo import AecStamps, EchoPath

DEFAULT_RATE = 24000  # Protocol::server_sample_rate_ when the hello has none
DEFAULT_FRAME_MS = 60
MAX_DECODE_QUEUE = 40  # MAX_DECODE_PACKETS_IN_QUEUE: 2400 ms / 60 ms


@dataclass
class DownlinkFrame:
    """One binary message from the server and what the device did with it."""

    t: float
    size: int
    timestamp: int
    accepted: bool = False
    reason: str = ""
    pcm: bytes = b""
    tts_index: int = 0


class Speaker:
    """Per-connection downlink state and counters. Decoding runs on the given executor."""

    def __init__(self, executor: Callable[[], Executor], echo: EchoPath | None = None) -> None:
        self._executor = executor
        self.sample_rate = DEFAULT_RATE
        self.frame_duration = DEFAULT_FRAME_MS
        self.frames: list[DownlinkFrame] = []
        self.stray_frames = self.bad_frames = self.decode_errors = 0
        self.overflow_frames = self.underruns = 0
        # Timestamps of played v2 frames, stamped onto the next uplink packets (server AEC).
        self.stamps = AecStamps()
        self.echo = echo
        self.play_end = 0.0
        self._decoder: OpusDecoder | None = None
        self._playout: deque[float] = deque()
        self._first_frame = True

    def start_answer(self) -> None:
        """`tts start`: ResetDecoder and an empty queue."""
        self._decoder = None
        self._playout.clear()
        self._first_frame = True
        self.stamps.clear_scheduled()  # queued frames never play
        if self.echo is not None:
            self.echo.cut(time.monotonic())

    async def receive(self, t: float, data: bytes, version: int, speaking: bool, tts_index: int) -> DownlinkFrame:
        """Handle one binary message that arrived at monotonic time `t`."""
        try:
            packet = decode_audio(data, version)
        except ProtocolError as exc:
            self.bad_frames += 1
            return self._keep(DownlinkFrame(t, len(data), 0, reason=f"bad frame: {exc.reason}"))
        frame = DownlinkFrame(t, len(packet.payload), packet.timestamp, tts_index=tts_index)
        if speaking:
            await self._play(frame, packet.payload)
        else:
            self.stray_frames += 1
            frame.reason = "not speaking"
        return self._keep(frame)

    def _keep(self, frame: DownlinkFrame) -> DownlinkFrame:
        self.frames.append(frame)
        return frame

    async def _play(self, frame: DownlinkFrame, payload: bytes) -> None:
        pcm, error = await self._decode(payload)
        if error:
            self.decode_errors += 1
            frame.reason = error
            return
        start = self._enqueue(frame.t, len(pcm) / 2 / self.sample_rate)
        if start is None:
            self.overflow_frames += 1
            frame.reason = f"decode queue full ({MAX_DECODE_QUEUE} packets): dropped"
            return
        self.stamps.played(start, frame.timestamp)
        if self.echo is not None:
            self.echo.play(start, pcm, self.sample_rate)
        frame.accepted, frame.pcm = True, pcm

    async def _decode(self, payload: bytes) -> tuple[bytes, str]:
        try:
            if self._decoder is None:
                self._decoder = OpusDecoder(self.sample_rate, 1)
            loop = asyncio.get_running_loop()
            pcm = await loop.run_in_executor(self._executor(), self._decoder.decode, payload)
        except (AudioError, ValueError) as exc:
            return b"", f"decode error: {exc}"
        if len(pcm) > self.sample_rate * self.frame_duration // 1000 * 2:
            # The firmware's PCM buffer holds one announced frame; longer packets fail.
            return b"", f"packet longer than frame_duration {self.frame_duration} ms"
        return pcm, ""

    def _enqueue(self, now: float, duration: float) -> float | None:
        """Queue a frame for playout; its start time, or None when the queue is full."""
        while self._playout and self._playout[0] <= now:
            self._playout.popleft()
        if len(self._playout) >= MAX_DECODE_QUEUE:
            return None
        if not self._playout and not self._first_frame:
            self.underruns += 1
        self._first_frame = False
        start = self._playout[-1] if self._playout else now
        self.play_end = start + duration
        self._playout.append(self.play_end)
        return start

    def pcm(self, tts_index: int | None = None) -> bytes:
        """PCM of the played frames (s16le mono at `sample_rate`), optionally of one answer."""
        return b"".join(f.pcm for f in self.frames
                        if f.accepted and (tts_index is None or f.tts_index == tts_index))

    @property
    def frame_times(self) -> list[float]:
        return [f.t for f in self.frames if f.accepted]
