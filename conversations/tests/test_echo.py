"""Server-side echo cancellation: timestamps → reference alignment, the bounded ring, missing
and late references (synthetic signals), and the real WebRTC canceller on a synthetic room."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conversations.pipeline.echo import (
    FRAME_BYTES,
    MAX_CONTINUATION,
    DownlinkStamps,
    EchoCanceller,
    ReferenceRing,
)
from conversations.providers import registry
from devices.protocol.opus import OpusDecoder, OpusEncoder

RATE = 16000
FRAME = 960


def tone_frames(count: int, rate: int = RATE) -> list[bytes]:
    """Frames of distinct tones (frame i at 300 + 40·i Hz), so each frame is recognisable."""
    frames = []
    for i in range(count):
        t = np.arange(rate * 60 // 1000) / rate
        frames.append((8000 * np.sin(2 * np.pi * (300 + 40 * i) * t)).astype("<i2").tobytes())
    return frames


def encode(frames: list[bytes], rate: int = RATE) -> list[bytes]:
    encoder = OpusEncoder(rate, 60, application="voip")
    return [encoder.encode(f) for f in frames]


def dominant_hz(pcm: bytes) -> float:
    x = np.frombuffer(pcm, "<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.fft.rfftfreq(len(x), 1 / RATE)[int(np.argmax(spectrum))])


class Recorder:
    """An AEC stream that records what it was given and returns the mic unchanged."""

    def __init__(self) -> None:
        self.references: list[bytes] = []

    def process(self, mic: bytes, reference: bytes) -> bytes:
        self.references.append(reference)
        return mic


def canceller(frames: int = 64) -> tuple[EchoCanceller, Recorder]:
    recorder = Recorder()
    return EchoCanceller(recorder, ReferenceRing(frames=frames)), recorder


def test_downlink_stamps_are_unique_increasing_and_never_zero() -> None:
    stamps = DownlinkStamps()
    burst = [stamps.next(1000) for _ in range(4)]  # the pacer sends a few frames at once
    assert burst == [1000, 1060, 1120, 1180]
    assert stamps.next(5000) == 5000  # a new reply after a pause: the clock again
    wrapped = DownlinkStamps()
    assert wrapped.next(2**32) == 1  # 0 would mean "no timestamp" to the device
    assert 0 < wrapped.next(2**32 + 30) < 2**32


def test_a_stamped_packet_gets_the_frame_sent_with_that_stamp() -> None:
    echo, recorder = canceller()
    tones = tone_frames(5)
    for stamp, packet in zip([100, 160, 220, 280, 340], encode(tones), strict=True):
        echo.ring.add(stamp, packet)
    echo.process(bytes(FRAME_BYTES), 220)
    echo.process(bytes(FRAME_BYTES), 340)
    # Opus at 16 kHz keeps a tone's pitch: the reference is that frame's tone, not a neighbour's.
    assert dominant_hz(recorder.references[0]) == pytest.approx(300 + 40 * 2, abs=20)
    assert dominant_hz(recorder.references[1]) == pytest.approx(300 + 40 * 4, abs=20)
    assert echo.stats.stamped == 2


def test_unstamped_packets_follow_the_last_stamp_for_a_few_frames_then_silence() -> None:
    echo, recorder = canceller()
    for stamp, packet in zip(range(60, 60 * 11, 60), encode(tone_frames(10)), strict=True):
        echo.ring.add(stamp, packet)
    echo.process(bytes(FRAME_BYTES), 120)  # frame 1
    for _ in range(MAX_CONTINUATION + 2):
        echo.process(bytes(FRAME_BYTES), 0)
    followed = [dominant_hz(r) for r in recorder.references[1 : 1 + MAX_CONTINUATION]]
    assert followed == pytest.approx([300 + 40 * i for i in (2, 3, 4)], abs=20)
    assert recorder.references[-1] == bytes(FRAME_BYTES)  # then nothing is assumed to play
    assert (echo.stats.continued, echo.stats.silent) == (MAX_CONTINUATION, 2)


def test_a_missing_or_unknown_reference_is_silence_and_counted() -> None:
    echo, recorder = canceller()
    echo.ring.add(60, encode(tone_frames(1))[0])
    echo.process(bytes(FRAME_BYTES), 999)  # never sent (or a hostile stamp)
    echo.process(bytes(FRAME_BYTES), 0)  # no continuation from an unknown frame
    assert recorder.references == [bytes(FRAME_BYTES)] * 2
    assert echo.stats.missing == 1 and echo.stats.stamped == 0


def test_the_ring_is_bounded_and_evicts_the_oldest_frames() -> None:
    echo, recorder = canceller(frames=8)
    for i, packet in enumerate(encode(tone_frames(20))):
        echo.ring.add(60 * (i + 1), packet)
    echo.process(bytes(FRAME_BYTES), 60)  # evicted long ago: a late stamp
    echo.process(bytes(FRAME_BYTES), 60 * 20)
    assert len(echo.ring) == 8
    assert recorder.references[0] == bytes(FRAME_BYTES) and echo.stats.missing == 1
    assert dominant_hz(recorder.references[1]) == pytest.approx(300 + 40 * 19, abs=20)


def test_pending_frames_are_bounded_while_nobody_decodes_them() -> None:
    ring = ReferenceRing(frames=4, pending=16)
    packet = encode(tone_frames(1))[0]
    for i in range(100):
        ring.add(i + 1, packet)
    assert ring.take_pending() == 16 and len(ring) == 4


def test_odd_lengths_pass_through_and_bad_reference_packets_are_silence() -> None:
    echo, recorder = canceller()
    echo.ring.add(60, b"\xff\xff\xff")  # not Opus: decodes to nothing, silence is used
    assert echo.process(b"\x01\x02" * 7, 60) == b"\x01\x02" * 7  # shorter than 10 ms: untouched
    echo.process(bytes(FRAME_BYTES), 60)
    assert recorder.references == [bytes(FRAME_BYTES)]


def test_webrtc_cancels_a_delayed_room_echo_found_by_timestamp() -> None:
    """Noise-like "speech" through a 4-tap room with 70 ms of delay inside the device: the
    canceller, given the stamped reference, removes most of it (ERLE in dB)."""
    rng = np.random.default_rng(7)
    seconds, delay = 6, int(0.070 * RATE)
    envelope = np.repeat(rng.uniform(0.2, 1.0, seconds * 10), RATE // 10)  # syllable-ish level changes
    sent = (rng.normal(0, 3000, seconds * RATE) * envelope).clip(-32768, 32767)
    packets = encode([sent[i : i + FRAME].astype("<i2").tobytes() for i in range(0, len(sent), FRAME)])
    decoder = OpusDecoder(RATE)  # the device plays what the Opus packets decode to
    played = np.frombuffer(b"".join(decoder.decode(p) for p in packets), "<i2").astype(np.float64)
    room = np.zeros_like(played)
    for tap_ms, gain in ((0, 0.6), (7, 0.3), (19, 0.15), (37, 0.07)):
        lag = delay + tap_ms * RATE // 1000
        room[lag:] += gain * played[: len(played) - lag]
    mic = (room + rng.normal(0, 20, len(room))).astype("<i2").tobytes()
    aec = registry.shared("aec", "webrtc")
    echo = EchoCanceller(aec.stream(), ReferenceRing())
    residual = bytearray()
    for index, packet in enumerate(packets):
        stamp = 60 * (index + 1)
        echo.ring.add(stamp, packet)
        residual += echo.process(mic[index * FRAME * 2 : (index + 1) * FRAME * 2], stamp)

    def level_db(pcm: bytes) -> float:
        x = np.frombuffer(pcm, "<i2").astype(np.float64)
        return float(10 * np.log10(np.mean(x**2) + 1e-9))

    tail = slice(3 * RATE * 2, None)  # after convergence
    assert level_db(mic[tail]) - level_db(bytes(residual[tail])) > 20
    assert echo.stats.stamped == len(packets)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 2**32 - 1)), max_size=80))
def test_any_order_of_sent_frames_and_hostile_stamps_keeps_the_ring_bounded(events: list[tuple[bool, int]]) -> None:
    """Frames sent and uplink stamps in any order, stamps of any 32-bit value (a hostile or
    buggy device): every packet gets a 60 ms reference and the ring never grows past its bound."""
    echo, recorder = canceller(frames=8)
    packet = encode(tone_frames(1))[0]
    for sent, stamp in events:
        if sent:
            echo.ring.add(stamp, packet)
        else:
            echo.process(bytes(FRAME_BYTES), stamp)
        assert len(echo.ring) <= 8
    assert all(len(r) == FRAME_BYTES for r in recorder.references)
    stats = echo.stats
    assert stats.stamped + stats.continued + stats.missing + stats.silent == len(recorder.references)
