"""Opus packets → an Ogg/Opus file, without re-encoding (pure: no Django, no files).

The packets are muxed as they are by PyAV's (FFmpeg's) Ogg muxer; we never build container
pages ourselves. Each packet's duration comes from its own TOC byte, read by libopus
(`opus_packet_get_nb_frames` × `opus_packet_get_samples_per_frame`), so 60 ms device frames,
1-byte DTX packets and any other valid frame size get correct timestamps. Packets libopus
rejects are skipped and counted: the uplink comes from an untrusted device.

Ogg Opus timestamps are always in 48 kHz units (RFC 7845), whatever rate the packets were
encoded at; the `OpusHead` is written by FFmpeg (pre-skip 312 samples, libopus's lookahead at
every rate), so the "input sample rate" it announces is informational only.
"""
from __future__ import annotations

import ctypes
import io
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

OGG_RATE = 48000
MAX_PACKET_SAMPLES = OGG_RATE * 120 // 1000  # RFC 6716: at most 120 ms per packet


class OggOpusError(Exception):
    """No file could be written (no valid packet, codec library missing, muxer failure)."""


@dataclass(frozen=True)
class OggOpus:
    data: bytes
    duration_ms: int
    packets: int
    skipped: int  # packets libopus rejected


def packet_samples_48k(packet: bytes) -> int | None:
    """Samples at 48 kHz this packet decodes to, or None when libopus calls it invalid."""
    if not packet:
        return None
    decoder = _libopus_decoder()
    pointer = ctypes.c_char_p(bytes(packet))
    frames = decoder.libopus_packet_get_nb_frames(pointer, ctypes.c_int(len(packet)))
    if frames < 1:
        return None
    per_frame = decoder.libopus_packet_get_samples_per_frame(pointer, ctypes.c_int(OGG_RATE))
    samples = frames * per_frame
    return samples if 0 < samples <= MAX_PACKET_SAMPLES else None


def ogg_opus(packets: list[bytes]) -> OggOpus:
    """Mux `packets` (one mono Opus stream, any encoder rate) into an Ogg/Opus file."""
    timed = []
    skipped = 0
    for packet in packets:
        samples = packet_samples_48k(packet)
        if samples is None:
            skipped += 1
        else:
            timed.append((bytes(packet), samples))
    if not timed:
        raise OggOpusError("no valid Opus packet")
    try:
        data, total = _mux(timed)
    except OggOpusError:
        raise
    except Exception as exc:  # PyAV raises its own error tree (av.error.FFmpegError, ValueError, ...)
        raise OggOpusError(f"Ogg muxing failed: {type(exc).__name__}") from exc
    return OggOpus(data=data, duration_ms=round(total * 1000 / OGG_RATE), packets=len(timed), skipped=skipped)


def _mux(timed: list[tuple[bytes, int]]) -> tuple[bytes, int]:
    import av  # noqa: PLC0415 - ~80 ms to import; only the history writer pays for it

    buffer = io.BytesIO()
    pts = 0
    with av.open(buffer, "w", format="ogg") as container:
        # An encoder stream only so the muxer gets Opus codec parameters and an OpusHead;
        # nothing is ever encoded through it (packets are muxed, not sent to the encoder).
        stream: Any = container.add_stream("libopus", rate=OGG_RATE, layout="mono")
        stream.time_base = Fraction(1, OGG_RATE)
        for data, samples in timed:
            packet = av.Packet(data)
            packet.stream = stream
            packet.time_base = stream.time_base
            packet.pts = packet.dts = pts
            packet.duration = samples
            container.mux(packet)
            pts += samples
    return buffer.getvalue(), pts


def _libopus_decoder() -> Any:
    try:
        import opuslib.api.decoder as decoder  # noqa: PLC0415 - a missing libopus is a clear error
    except Exception as exc:  # opuslib raises a bare Exception when libopus.so is absent
        raise OggOpusError("Opus library not available: install libopus0") from exc
    return decoder
