"""Whisper-style log-mel features for the Smart Turn v3 end-of-turn model (numpy only).

Smart Turn v3 takes the log-mel spectrogram of exactly 8 s of 16 kHz audio, the way
`transformers.WhisperFeatureExtractor(chunk_length=8)` computes it. Facts taken from the
model's published preprocessing (pipecat-ai 1.14, `local_smart_turn_v3.py`):

- keep the LAST 8 s of the utterance; a shorter one is zero-padded at the START, so the end
  of speech always sits at the end of the window, where the model looks;
- normalise the padded waveform to zero mean and unit variance (float32, eps 1e-7);
- centred STFT: reflect padding of n_fft/2, periodic Hann window of 400, hop 160, power
  spectrum; 80 Slaney mel filters (0-8 kHz, Slaney area normalisation);
- log10 with a 1e-10 floor, drop the last frame (800 frames remain), clamp to max - 8,
  then (x + 4) / 4.

Our own implementation of that formula, so the runtime needs neither pipecat nor
transformers; `conversations/providers/turn/tests` checks it against pipecat's copy.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

SAMPLE_RATE = 16000
WINDOW_SECONDS = 8
WINDOW_SAMPLES = SAMPLE_RATE * WINDOW_SECONDS
N_FFT = 400
HOP = 160
N_MELS = 80
FRAMES = WINDOW_SAMPLES // HOP  # 800


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = 3.0 * hz / 200.0
    log = 15.0 + np.log(np.maximum(hz, 1e-12) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log, linear)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = 200.0 * mel / 3.0
    log = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0))
    return np.where(mel >= 15.0, log, linear)


def mel_filters() -> np.ndarray:
    """Triangular Slaney-normalised filters, shape (N_FFT // 2 + 1, N_MELS)."""
    edges = _mel_to_hz(np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(SAMPLE_RATE / 2)), N_MELS + 2))
    bins = np.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1)
    rising = (bins[:, None] - edges[None, :-2]) / np.diff(edges)[None, :-1]
    falling = (edges[None, 2:] - bins[:, None]) / np.diff(edges)[None, 1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


_FILTERS = mel_filters()
_HANN = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)  # periodic


def last_window(pcm16k: bytes) -> np.ndarray:
    """The last 8 s of s16 mono PCM as float32 in [-1, 1], zero-padded at the start."""
    samples = np.frombuffer(pcm16k[: len(pcm16k) & ~1], dtype="<i2")[-WINDOW_SAMPLES:]
    window = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
    if samples.size:
        window[-samples.size :] = samples.astype(np.float32) / 32768.0
    return window


def log_mel(window: np.ndarray) -> np.ndarray:
    """Features of an 8 s float window (see the module docstring), shape (80, 800), float32."""
    if window.shape != (WINDOW_SAMPLES,):
        raise ValueError(f"need {WINDOW_SAMPLES} samples, got {window.shape}")
    x = window.astype(np.float32)
    x = (x - x.mean()) / np.sqrt(x.var() + 1e-7)
    padded = np.pad(x.astype(np.float64), N_FFT // 2, mode="reflect")
    frames = sliding_window_view(padded, N_FFT)[::HOP]  # (801, 400)
    power = np.abs(np.fft.rfft(frames * _HANN, axis=-1)) ** 2  # (801, 201)
    mel = np.log10(np.maximum(power @ _FILTERS, 1e-10)).T[:, :-1]  # (80, 800)
    mel = np.maximum(mel, mel.max() - 8.0)
    return ((mel + 4.0) / 4.0).astype(np.float32)
