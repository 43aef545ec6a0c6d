"""Server-side echo cancellation for devices that announce `features.aec` (binary protocol v2).

The device cannot cancel its own voice, so it tells us what it was playing: every downlink
v2 frame carries a timestamp, the device remembers the timestamps of the frames it has
played and stamps each uplink packet with the oldest one not yet used (at most 3 queued;
beyond that it sends 0 and drops one) [protocol-reference §4.2-4.3; FW
main/audio/audio_service.cc `AudioOutputTask`, `PushTaskToEncodeQueue`]. So an uplink packet
stamped T was captured while frame T was coming out of the speaker.

Three parts, each with one owner:
- `DownlinkStamps` (the session, on the loop) gives every downlink frame a timestamp:
  milliseconds of the session's clock, strictly increasing, never 0, within 32 bits.
- `ReferenceRing` keeps the last `RING_FRAMES` sent frames. The loop only appends the
  Opus packet (`add`, a deque append); the hearing's pool job decodes them in send order at
  16 kHz (what the device hears, at the uplink's rate) and looks them up by timestamp.
- `EchoCanceller` (in the session's `Ear`, pool jobs only) pairs each uplink packet with
  its reference — by its timestamp, or for an unstamped packet the frame after the last
  one used, for a few frames — and hands both to the AEC provider. A reference that never
  arrived, was evicted or is unknown is silence: the canceller then passes the microphone
  through (and its filter keeps what it learnt).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from conversations.providers.base import AECStream
from devices.protocol.opus import AudioError, OpusDecoder

SAMPLE_RATE = 16000
FRAME_MS = 60
FRAME_BYTES = SAMPLE_RATE * FRAME_MS // 1000 * 2
RING_FRAMES = 64  # ~3.8 s of sent audio: the device's 2.4 s decode queue plus margin
PENDING_FRAMES = 256  # sent but not yet decoded (the hearing is behind or paused)
MAX_CONTINUATION = 3  # unstamped packets that may still follow the last stamped frame
_U32 = 1 << 32


class DownlinkStamps:
    """Timestamps for downlink v2 frames: ms of the session's clock, unique per frame.

    Frames leave in bursts (the pacer sends up to 3 ahead), so the clock alone would repeat
    values; each stamp is at least one frame after the previous one instead.
    """

    def __init__(self) -> None:
        self._last = 0

    def next(self, now_ms: int) -> int:
        stamp = max(int(now_ms), self._last + FRAME_MS)
        self._last = stamp
        return stamp % _U32 or 1  # 0 means "no timestamp" to the device


@dataclass
class EchoStats:
    stamped: int = 0  # uplink packets whose reference was found by timestamp
    continued: int = 0  # unstamped packets given the frame after the last one
    missing: int = 0  # stamped, but the reference is gone or never was (silence used)
    silent: int = 0  # nothing was playing: silence as the reference
    dropped: int = 0  # sent frames dropped before they were decoded (ring overflow)


class ReferenceRing:
    """What was sent, bounded. `add` runs on the loop; everything else in the pool job."""

    def __init__(self, frames: int = RING_FRAMES, pending: int = PENDING_FRAMES) -> None:
        # deque.append / popleft are atomic: the loop appends while a pool job drains.
        self._pending: deque[tuple[int, bytes]] = deque(maxlen=pending)
        self._frames: OrderedDict[int, bytes] = OrderedDict()
        self._order: deque[int] = deque()  # stamps in send order, for "the next frame"
        self._max = frames
        self._decoder: OpusDecoder | None = None
        self.added = 0

    def add(self, stamp: int, opus: bytes) -> None:
        """A frame just went to the device (loop side: no decoding here)."""
        self._pending.append((stamp, opus))
        self.added += 1

    def take_pending(self) -> int:
        """Decode what was sent since the last call, in order; returns how many."""
        count = 0
        while self._pending:
            stamp, opus = self._pending.popleft()
            self._store(stamp, self._decode(opus))
            count += 1
        return count

    def get(self, stamp: int) -> bytes | None:
        return self._frames.get(stamp)

    def after(self, stamp: int) -> int | None:
        """The stamp of the frame sent right after `stamp`, if both are still kept."""
        if stamp not in self._frames:
            return None
        order = self._order
        for i in range(len(order) - 1, -1, -1):  # recent frames are the ones asked for
            if order[i] == stamp:
                return order[i + 1] if i + 1 < len(order) else None
        return None

    def __len__(self) -> int:
        return len(self._frames)

    def _decode(self, opus: bytes) -> bytes:
        if self._decoder is None:
            self._decoder = OpusDecoder(SAMPLE_RATE)
        try:
            pcm = self._decoder.decode(opus)
        except AudioError:
            return bytes(FRAME_BYTES)
        return _fit(pcm)

    def _store(self, stamp: int, pcm: bytes) -> None:
        if stamp in self._frames:  # a wrapped clock: the old frame is long gone anyway
            del self._frames[stamp]
            self._order.remove(stamp)
        self._frames[stamp] = pcm
        self._order.append(stamp)
        while len(self._frames) > self._max:
            self._frames.popitem(last=False)
            self._order.popleft()


class EchoCanceller:
    """Aligns each uplink packet with what the device played and cancels it."""

    def __init__(self, stream: AECStream, ring: ReferenceRing) -> None:
        self._stream = stream
        self.ring = ring
        self._cursor: int | None = None  # stamp of the last reference used
        self._unstamped = 0  # unstamped packets since it
        self.stats = EchoStats()

    def reference_for(self, stamp: int) -> bytes:
        """The 60 ms of 16 kHz PCM the device played while it captured a packet stamped so."""
        self.ring.take_pending()
        if stamp:
            self._cursor, self._unstamped = stamp, 0
            pcm = self.ring.get(stamp)
            if pcm is None:
                self.stats.missing += 1
                return bytes(FRAME_BYTES)
            self.stats.stamped += 1
            return pcm
        # No stamp: either nothing is playing, or the device's stamp queue was briefly
        # empty (or overfull, when it drops one) while playback went on: keep following.
        if self._cursor is not None and self._unstamped < MAX_CONTINUATION:
            following = self.ring.after(self._cursor)
            if following is not None:
                self._cursor = following
                self._unstamped += 1
                self.stats.continued += 1
                return self.ring.get(following) or bytes(FRAME_BYTES)
        self._cursor = None
        self.stats.silent += 1
        return bytes(FRAME_BYTES)

    def process(self, pcm: bytes, stamp: int) -> bytes:
        """The residual of one decoded uplink packet (16 kHz; 60 ms, or what it decoded to)."""
        reference = self.reference_for(stamp)
        usable = len(pcm) - len(pcm) % 320  # whole 10 ms chunks; a stray tail passes through
        if usable <= 0:
            return pcm
        residual = self._stream.process(pcm[:usable], _fit(reference, usable))
        return residual + pcm[usable:]


def _fit(pcm: bytes, size: int = FRAME_BYTES) -> bytes:
    return pcm[:size] if len(pcm) >= size else pcm + bytes(size - len(pcm))
