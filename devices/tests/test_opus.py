from __future__ import annotations

import ctypes
import ctypes.util
import sys

import numpy as np
import pytest

from devices.protocol.opus import AudioError, OpusDecoder, OpusEncoder, _opuslib
from testing.speech import opus_packets, speak, with_silence


def _samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def _best_correlation(reference: bytes, decoded: bytes, max_delay: int = 600) -> float:
    """Correlation after aligning for the codec's look-ahead delay (a few ms)."""
    ref, out = _samples(reference), _samples(decoded)
    n = len(ref) - max_delay
    return max(float(np.corrcoef(ref[:n], out[d : d + n])[0, 1]) for d in range(0, max_delay, 2))


def _round_trip(pcm: bytes, rate: int, application: str) -> bytes:
    encoder = OpusEncoder(rate, 60, bitrate=24000, application=application)
    decoder = OpusDecoder(rate)
    size = encoder.frame_bytes
    frames = (pcm[i : i + size] for i in range(0, len(pcm), size))
    return b"".join(decoder.decode(encoder.encode(frame)) for frame in frames)


@pytest.mark.parametrize(("rate", "application"), [(16000, "voip"), (24000, "audio")])
def test_speech_survives_a_real_libopus_round_trip(rate: int, application: str) -> None:
    speech = speak("turn on the kitchen light", rate=rate)
    decoded = _round_trip(speech, rate, application)
    assert len(decoded) >= len(speech)
    assert _best_correlation(speech, decoded) > 0.8


def test_frame_bytes_is_one_frame_of_s16_mono() -> None:
    assert OpusEncoder(24000, 60).frame_bytes == 2880
    assert OpusEncoder(16000, 20).frame_bytes == 640


def test_short_input_is_zero_padded_to_a_full_frame() -> None:
    half = bytes(range(256)) * 5  # 1280 bytes of arbitrary s16 samples
    padded = half + bytes(2880 - len(half))
    assert OpusEncoder(24000, 60).encode(half) == OpusEncoder(24000, 60).encode(padded)


def test_input_longer_than_a_frame_is_rejected() -> None:
    with pytest.raises(ValueError):
        OpusEncoder(24000, 60).encode(bytes(2882))


def test_odd_length_input_is_rejected() -> None:
    with pytest.raises(ValueError):
        OpusEncoder(24000, 60).encode(bytes(101))


def test_unsupported_encoder_settings_are_rejected() -> None:
    with pytest.raises(ValueError):
        OpusEncoder(22050, 60)
    with pytest.raises(ValueError):
        OpusEncoder(24000, 30)
    with pytest.raises(ValueError):
        OpusEncoder(24000, 60, application="music")


@pytest.mark.parametrize("packet", [b"\xff", b"\x03", b"\x03\x00", b"garbage!!" * 10])
def test_invalid_packets_raise_audio_error_not_opuslib_errors(packet: bytes) -> None:
    import opuslib.exceptions

    with pytest.raises(AudioError) as caught:
        OpusDecoder(16000).decode(packet)
    assert not isinstance(caught.value, opuslib.exceptions.OpusError)


def test_empty_packet_is_rejected_instead_of_concealed() -> None:
    with pytest.raises(AudioError):
        OpusDecoder(16000).decode(b"")


def test_dtx_silence_becomes_tiny_packets_that_decode_to_full_frames() -> None:
    packets = opus_packets(with_silence(b"", 16000, 0, 1800))
    tiny = [p for p in packets if len(p) <= 2]
    assert tiny, "DTX should shrink steady silence to 1-2 byte packets"
    decoder = OpusDecoder(16000)
    assert all(len(decoder.decode(p)) == 1920 for p in packets)


def test_decoder_accepts_packets_longer_than_60_ms() -> None:
    encoder = OpusEncoder(16000, 120, application="voip")
    packet = encoder.encode(speak("hello", rate=16000)[: encoder.frame_bytes])
    assert len(OpusDecoder(16000).decode(packet)) == 16000 * 120 // 1000 * 2


def test_device_style_uplink_decodes_packet_by_packet() -> None:
    clip = with_silence(speak("what time is it", rate=16000), 16000, 500, 500)
    decoder = OpusDecoder(16000)
    decoded = b"".join(decoder.decode(p) for p in opus_packets(clip))
    assert len(decoded) == -(-len(clip) // 1920) * 1920
    assert _best_correlation(clip, decoded) > 0.8


def test_decoder_matches_opuslib_sample_for_sample_and_its_output_is_not_reused() -> None:
    """The direct libopus call (one buffer per decoder) gives opuslib's output, and each
    result is a copy: the next decode does not change an earlier one."""
    import opuslib

    clip = with_silence(speak("what time is it", rate=16000), 16000, 300, 300)
    packets = opus_packets(clip)
    reference = opuslib.Decoder(16000, 1)
    decoder = OpusDecoder(16000)
    ours = [decoder.decode(p) for p in packets]
    assert ours == [reference.decode(p, 1920) for p in packets]
    assert len({id(pcm) for pcm in ours}) == len(ours) and any(ours[0] != pcm for pcm in ours)
    stereo = OpusDecoder(16000, channels=2)
    assert len(stereo.decode(packets[0])) == 2 * len(ours[0])


def test_decode_keeps_the_interpreter_lock() -> None:
    """libopus is called through ctypes.PyDLL (the lock kept), not opuslib's CDLL binding,
    which gives the lock up and makes the hearing thread queue behind the event loop to take
    it back for every packet (bench/hearing_gil.py)."""
    decode = OpusDecoder(16000)._opus_decode
    assert decode._flags_ & ctypes._FUNCFLAG_PYTHONAPI
    assert OpusDecoder(16000)._opus_decode is decode  # bound once per process


@pytest.mark.parametrize("keep_lock", [False, True])
def test_encode_makes_libopus_own_packets_with_or_without_the_lock(keep_lock: bool) -> None:
    """Our binding (one output buffer per encoder; the lock given up or kept) makes the packets
    opuslib's encoder makes with the same settings, whole frames and a short tail alike."""
    opuslib = _opuslib()
    pcm = speak("the first words of a reply", rate=24000)
    ours = OpusEncoder(24000, 60, application="voip", complexity=5)
    theirs = opuslib.Encoder(24000, 1, "voip")
    theirs.bitrate, theirs.complexity, theirs.signal = 24000, 5, opuslib.SIGNAL_VOICE
    size = ours.frame_bytes
    frames = [pcm[i : i + size] for i in range(0, len(pcm), size)]
    assert len(frames) > 10 and len(frames[-1]) < size
    expected = [theirs.encode(frame.ljust(size, b"\0"), size // 2) for frame in frames]
    assert [ours.encode(frame, keep_lock=keep_lock) for frame in frames] == expected
    assert bool(ours._opus_encode[keep_lock]._flags_ & ctypes._FUNCFLAG_PYTHONAPI) == keep_lock


def test_missing_libopus_is_reported_as_audio_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Re-import opuslib with the shared library "absent", as on a host without libopus0.
    for name in [m for m in sys.modules if m == "opuslib" or m.startswith("opuslib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    with pytest.raises(AudioError, match="libopus0"):
        _opuslib()
