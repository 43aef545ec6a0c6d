from __future__ import annotations

import io
import wave
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from devices.protocol.audio import (
    decode_audio_file,
    pcm_frames,
    read_wav,
    resample,
    rms,
    write_wav,
)
from devices.protocol.opus import AudioError


def tone(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return amplitude * 32767 * np.sin(2 * np.pi * freq * t)


def s16(samples: np.ndarray) -> bytes:
    return np.rint(samples).astype("<i2").tobytes()


def as_array(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def relative_error(pcm: bytes, expected: np.ndarray, edge: int = 100) -> float:
    got = as_array(pcm)[edge:-edge]
    want = expected[edge:-edge]
    return float(np.sqrt(np.mean((got - want) ** 2)) / np.sqrt(np.mean(want**2)))


def dominant_frequency(pcm: bytes, rate: int) -> float:
    x = as_array(pcm)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


RATE_PAIRS = [(22050, 16000), (24000, 16000), (16000, 24000), (22050, 24000), (48000, 16000)]


@pytest.mark.parametrize(("src", "dst"), RATE_PAIRS)
@pytest.mark.parametrize("seconds", [0.06, 1.0])  # both paths: short numpy, long PyAV
def test_resampling_preserves_a_speech_band_tone(src: int, dst: int, seconds: float) -> None:
    out = resample(s16(tone(1000, src, seconds)), src, dst)
    assert len(out) // 2 == -(-int(src * seconds) * dst // src)
    assert relative_error(out, tone(1000, dst, seconds)[: len(out) // 2]) < 0.02


@pytest.mark.parametrize("seconds", [0.06, 1.0])
def test_downsampling_filters_out_what_would_alias(seconds: float) -> None:
    # 10 kHz does not exist at 16 kHz; without a low-pass it would fold down to 6 kHz.
    out = resample(s16(tone(10000, 24000, seconds)), 24000, 16000)
    level = rms(out[400:-400]) / (0.5 * 32767 / np.sqrt(2))
    assert 20 * np.log10(level + 1e-9) < -50


def test_resampling_to_the_same_rate_returns_the_input() -> None:
    pcm = s16(tone(440, 16000, 0.1))
    assert resample(pcm, 16000, 16000) == pcm


def test_resampling_tiny_and_empty_inputs_keeps_the_length_contract() -> None:
    assert resample(b"", 22050, 16000) == b""
    assert len(resample(bytes(6), 16000, 24000)) == 2 * 5  # ceil(3 * 1.5)


def test_resampling_rejects_odd_byte_counts_and_bad_rates() -> None:
    with pytest.raises(ValueError):
        resample(b"\x00\x01\x02", 16000, 24000)
    with pytest.raises(ValueError):
        resample(bytes(4), 0, 24000)


def test_pcm_frames_splits_and_zero_pads_the_last_frame() -> None:
    pcm = bytes(range(256)) * 10  # 2560 bytes = 1280 samples
    frames = list(pcm_frames(pcm, 16000, 60))
    assert [len(f) for f in frames] == [1920, 1920]
    assert b"".join(frames)[: len(pcm)] == pcm
    assert frames[-1][len(pcm) - 1920 :] == bytes(1920 * 2 - len(pcm))


def test_pcm_frames_of_nothing_is_nothing() -> None:
    assert list(pcm_frames(b"", 24000)) == []


def test_wav_round_trip(tmp_path: Path) -> None:
    pcm = s16(tone(440, 22050, 0.3))
    write_wav(tmp_path / "a.wav", pcm, 22050)
    assert read_wav(tmp_path / "a.wav") == (pcm, 22050)


def _write_raw_wav(path: Path, frames: bytes, channels: int, width: int, rate: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(frames)


def test_stereo_wav_is_downmixed_to_mono(tmp_path: Path) -> None:
    left, right = tone(440, 16000, 0.1, 0.4), tone(440, 16000, 0.1, 0.2)
    interleaved = np.stack([left, right], axis=1).reshape(-1)
    _write_raw_wav(tmp_path / "s.wav", s16(interleaved), 2, 2, 16000)
    pcm, rate = read_wav(tmp_path / "s.wav")
    assert rate == 16000
    assert np.max(np.abs(as_array(pcm) - (left + right) / 2)) <= 1.0


def test_24_bit_and_8_bit_wavs_are_converted_to_s16(tmp_path: Path) -> None:
    x = tone(440, 8000, 0.1, 0.5)
    as24 = (np.rint(x * 256).astype("<i4").view(np.uint8).reshape(-1, 4)[:, :3]).tobytes()
    _write_raw_wav(tmp_path / "24.wav", as24, 1, 3, 8000)
    as8 = (np.rint(x / 256) + 128).astype(np.uint8).tobytes()
    _write_raw_wav(tmp_path / "8.wav", as8, 1, 1, 8000)
    assert np.max(np.abs(as_array(read_wav(tmp_path / "24.wav")[0]) - x)) <= 1.0
    assert np.max(np.abs(as_array(read_wav(tmp_path / "8.wav")[0]) - x)) <= 256.0


def _encode_with_pyav(samples: np.ndarray, rate: int, fmt: str, codec: str) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        pcm = samples.astype("<i2")[None, :]
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = rate, 0, Fraction(1, rate)
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("fmt", "codec", "rate"),
    [("mp3", "libmp3lame", 24000), ("ogg", "libopus", 48000), ("wav", "pcm_s16le", 16000)],
)
def test_compressed_files_decode_to_mono_s16_at_their_own_rate(
    fmt: str, codec: str, rate: int
) -> None:
    data = _encode_with_pyav(np.rint(tone(1000, rate, 1.0)), rate, fmt, codec)
    pcm, got_rate = decode_audio_file(data)
    assert got_rate == rate
    assert abs(len(pcm) / 2 / rate - 1.0) < 0.1  # codecs add a little priming/padding
    assert abs(dominant_frequency(pcm, rate) - 1000) < 10


def test_garbage_is_not_an_audio_file() -> None:
    with pytest.raises(AudioError):
        decode_audio_file(b"definitely not audio" * 50)


def test_rms_is_in_s16_units() -> None:
    assert rms(b"") == 0.0
    assert rms(bytes(640)) == 0.0
    assert rms(s16(np.full(100, 32767.0))) == pytest.approx(32767)
    assert rms(s16(tone(440, 16000, 1.0, 0.5))) == pytest.approx(0.5 * 32767 / np.sqrt(2), rel=1e-3)
