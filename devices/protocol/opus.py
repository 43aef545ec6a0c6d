"""Opus encode/decode for device audio, a thin typed layer over opuslib (libopus).

Uplink packets come from the device (16 kHz, 60 ms, DTX on); downlink packets go to it at the
rate announced in the server hello. Neither class is thread-safe: each session owns one of
each and uses it only from its own executor.
"""
from __future__ import annotations

import ctypes
import functools
from types import ModuleType
from typing import Any

SAMPLE_WIDTH = 2  # bytes per s16le sample
VALID_RATES = (8000, 12000, 16000, 24000, 48000)
# libopus >= 1.2 accepts 80/100/120 ms frames; 2.5 ms is left out so frame sizes stay integral.
VALID_FRAME_MS = (5, 10, 20, 40, 60, 80, 100, 120)
# The longest frame an Opus packet can hold. Decoding into a buffer this size means any valid
# packet decodes, whatever frame duration the sender picked.
MAX_PACKET_MS = 120
MAX_PACKET_BYTES = 4000  # libopus's recommended output buffer for one packet


class AudioError(Exception):
    """Audio could not be decoded or encoded (bad packet, missing codec library)."""


def _opuslib() -> ModuleType:
    """Import opuslib, turning its bare `Exception` about a missing libopus into AudioError."""
    try:
        import opuslib  # noqa: PLC0415 - lazy so a missing libopus fails with a clear message
        import opuslib.api.ctl  # noqa: PLC0415
    except Exception as exc:  # opuslib raises a plain Exception when libopus.so is absent
        raise AudioError(
            "Opus library not available: install libopus0 (apt-get install libopus0)"
        ) from exc
    return opuslib


def _reason(exc: Exception) -> str:
    """libopus's own error text (opuslib's str() shows it as a bytes repr)."""
    import opuslib.api.info  # noqa: PLC0415 - already loaded: the error came from opuslib

    code = getattr(exc, "code", None)
    if not isinstance(code, int):
        return str(exc)
    return opuslib.api.info.strerror(code).decode("ascii", "replace")


@functools.cache
def _libopus(opuslib: ModuleType, keep_lock: bool) -> Any:
    """libopus with `opus_decode` and `opus_encode` typed, through `ctypes.PyDLL` (a call keeps
    the interpreter lock) or `ctypes.CDLL` (gives it up, as opuslib binds it). One per mode.

    The decoder keeps the lock: a decode is ~30-80 us, but taking the lock back waits for
    whichever thread took it, and a busy event loop hands it over only after the switch
    interval (5 ms). Beside a busy loop a hearing group of 24 packets (~6 ms of CPU) took 78 /
    147 ms of wall time (p50 / p99) with the lock given up per packet, 51 / 114 ms with it kept
    (bench/hearing_gil.py, issue 17). The encoder gives it up in the speaking pools (keeping it
    there raised P1's p50) and keeps it for a reply's first frame on the loop (speak.py).
    """
    library = (ctypes.PyDLL if keep_lock else ctypes.CDLL)(opuslib.api.lib_location)
    library.opus_decode.argtypes = opuslib.api.decoder.libopus_decode.argtypes
    library.opus_decode.restype = ctypes.c_int
    library.opus_encode.argtypes = (opuslib.api.encoder.EncoderPointer, ctypes.c_char_p, ctypes.c_int,
                                    ctypes.c_char_p, ctypes.c_int32)
    library.opus_encode.restype = ctypes.c_int32
    return library


def _check_rate(sample_rate: int) -> None:
    if sample_rate not in VALID_RATES:
        raise ValueError(f"Opus sample rate must be one of {VALID_RATES}, got {sample_rate}")


class OpusDecoder:
    """Decodes one Opus stream to s16le PCM at `sample_rate`."""

    def __init__(self, sample_rate: int = 16000, channels: int = 1) -> None:
        _check_rate(sample_rate)
        if channels not in (1, 2):
            raise ValueError(f"Opus channels must be 1 or 2, got {channels}")
        self._opuslib = _opuslib()
        self.sample_rate = sample_rate
        self.channels = channels
        self._max_frame = sample_rate * MAX_PACKET_MS // 1000
        self._decoder: Any = self._opuslib.Decoder(sample_rate, channels)
        # libopus is called directly into one buffer kept per decoder: opuslib's `decode`
        # allocates twice the largest frame per call and copies the samples out through a
        # Python list (~60 us of a ~110 us decode, under the GIL; issue 17).
        self._pcm = (ctypes.c_int16 * (self._max_frame * channels))()
        self._state = self._decoder.decoder_state
        self._opus_decode = _libopus(self._opuslib, keep_lock=True).opus_decode

    def decode(self, packet: bytes) -> bytes:
        """Decode one packet. Raises AudioError for empty or malformed packets.

        A 1–3 byte DTX packet is valid: libopus answers it with comfort noise / concealment
        of the duration its TOC byte announces.
        """
        if not packet:
            # An empty buffer would make libopus run packet-loss concealment for the full
            # 120 ms buffer, inventing audio; the device never sends one on purpose.
            raise AudioError("empty Opus packet")
        data = bytes(packet)
        samples = self._opus_decode(self._state, data, len(data), self._pcm, self._max_frame, 0)
        if samples < 0:
            reason = _reason(self._opuslib.exceptions.OpusError(samples))
            raise AudioError(f"invalid Opus packet ({len(data)} bytes): {reason}")
        return ctypes.string_at(self._pcm, samples * self.channels * SAMPLE_WIDTH)

    def reset(self) -> None:
        """Forget inter-packet state, e.g. at the start of a new utterance."""
        self._decoder.reset_state()


class OpusEncoder:
    """Encodes fixed-size frames of s16le mono PCM to Opus packets."""

    def __init__(
        self,
        sample_rate: int = 24000,
        frame_ms: int = 60,
        bitrate: int = 24000,
        application: str = "audio",
        *,
        complexity: int = 10,
        dtx: bool = False,
    ) -> None:
        _check_rate(sample_rate)
        if frame_ms not in VALID_FRAME_MS:
            raise ValueError(f"Opus frame_ms must be one of {VALID_FRAME_MS}, got {frame_ms}")
        opuslib = _opuslib()
        if application not in opuslib.APPLICATION_TYPES_MAP:
            raise ValueError(f"unknown Opus application {application!r}")
        self.sample_rate = sample_rate
        self.frame_ms = frame_ms
        self._opuslib = opuslib
        self._frame_samples = sample_rate * frame_ms // 1000
        self._encoder: Any = opuslib.Encoder(sample_rate, 1, application)
        self._configure(bitrate, complexity, dtx)
        self._state = self._encoder.encoder_state
        self._packet = ctypes.create_string_buffer(MAX_PACKET_BYTES)  # one output buffer per encoder
        # (giving the lock up, keeping it), indexed by `keep_lock`
        self._opus_encode = (_libopus(opuslib, keep_lock=False).opus_encode,
                             _libopus(opuslib, keep_lock=True).opus_encode)

    def _configure(self, bitrate: int, complexity: int, dtx: bool) -> None:
        try:
            self._encoder.bitrate = bitrate
            self._encoder.complexity = complexity
            # Speech is all we send; the hint lets libopus favour SILK/hybrid modes.
            self._encoder.signal = self._opuslib.SIGNAL_VOICE
            ctl = self._opuslib.api.ctl.set_dtx
            self._opuslib.api.encoder.encoder_ctl(self._encoder.encoder_state, ctl, int(dtx))
        except self._opuslib.exceptions.OpusError as exc:
            raise ValueError(f"invalid Opus encoder setting: {_reason(exc)}") from exc

    @property
    def frame_bytes(self) -> int:
        """Size in bytes of one s16le mono frame, the unit `encode` takes."""
        return self._frame_samples * SAMPLE_WIDTH

    def encode(self, pcm: bytes, *, keep_lock: bool = False) -> bytes:
        """Encode exactly one frame; shorter input (the tail of a sentence) is zero-padded.
        `keep_lock`: the call keeps the interpreter lock (see `_libopus`)."""
        size = len(pcm)
        if size > self.frame_bytes:
            raise ValueError(f"PCM frame too long: {size} bytes > {self.frame_bytes}")
        if size % SAMPLE_WIDTH:
            raise ValueError(f"PCM length {size} is not a whole number of s16 samples")
        if size < self.frame_bytes:
            pcm = bytes(pcm) + bytes(self.frame_bytes - size)
        encode = self._opus_encode[keep_lock]
        written = encode(self._state, bytes(pcm), self._frame_samples, self._packet, MAX_PACKET_BYTES)
        if written < 0:  # a libopus error code
            raise AudioError(f"Opus encode failed: {_reason(self._opuslib.exceptions.OpusError(written))}")
        return ctypes.string_at(self._packet, written)

    def reset(self) -> None:
        """Start a fresh stream (new sentence after an abort) without re-creating libopus state."""
        self._encoder.reset_state()
