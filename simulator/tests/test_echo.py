"""The simulator's echo path and the firmware's server-AEC timestamp queue."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from simulator import cli
from simulator.echo import MAX_TIMESTAMPS_IN_QUEUE, AecStamps, EchoPath, parse_taps

RATE = 16000


def click(rate: int = RATE, ms: int = 60) -> bytes:
    """One frame of silence with a single full-scale sample at its start."""
    x = np.zeros(rate * ms // 1000, "<i2")
    x[0] = 20000
    return x.tobytes()


def test_the_echo_comes_back_after_the_delay_scaled_and_with_its_reflections() -> None:
    path = EchoPath(delay_ms=50, gain=0.5, taps=((0, 1.0), (10, 0.5)))
    path.play(100.0, click(), RATE)
    echo = path.echo(100.0, RATE // 10)  # the first 100 ms from the frame's start
    peaks = {int(i): round(float(echo[i])) for i in np.flatnonzero(np.abs(echo) > 100)}
    assert peaks == {800: 10000, 960: 5000}  # 50 ms × 0.5, then 60 ms × 0.5 × 0.5


def test_frames_are_placed_by_their_play_time_and_mixed_with_the_user() -> None:
    path = EchoPath(delay_ms=0, gain=1.0, taps=((0, 1.0),))
    path.play(10.0, click(), RATE)
    path.play(10.06, click(), RATE)
    user = (np.ones(960, "<i2") * 7).tobytes()
    mixed = np.frombuffer(path.mix(10.06, user), "<i2")
    assert mixed[0] == 20007 and mixed[1] == 7
    path.cut(10.06)  # `tts start` resets the decoder: the second frame never plays
    assert np.frombuffer(path.mix(10.06, user), "<i2")[0] == 7


def test_downlink_at_24_khz_is_heard_at_16_khz() -> None:
    path = EchoPath(delay_ms=0, gain=1.0, taps=((0, 1.0),))
    t = np.arange(1440) / 24000
    path.play(5.0, (8000 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes(), 24000)
    echo = path.echo(5.0, 960)
    assert np.sqrt(np.mean(echo[100:860] ** 2)) == pytest.approx(8000 / np.sqrt(2), rel=0.05)


def test_stamps_follow_the_firmware_queue() -> None:
    stamps = AecStamps()
    for i in range(6):
        stamps.played(1.0 + 0.06 * i, 100 + 60 * i)
    stamps.played(1.5, 0)  # an unstamped frame pushes nothing
    assert stamps.for_uplink(0.5) == 0  # nothing has played yet
    assert stamps.for_uplink(1.0) == 100
    # Five more played before the next packet: more than 3 queued, so 0 and one dropped.
    assert stamps.for_uplink(1.3) == 0 and stamps.dropped == 1
    assert [stamps.for_uplink(1.3) for _ in range(5)] == [0, 280, 340, 400, 0]
    assert len(stamps.queue) <= MAX_TIMESTAMPS_IN_QUEUE


def test_taps_parse_and_bad_ones_are_refused() -> None:
    assert parse_taps("0:1, 7:0.45") == ((0.0, 1.0), (7.0, 0.45))
    for bad in ("", "x", "0:1,600:1", "5:9", "-1:0.5"):
        with pytest.raises(ValueError):
            parse_taps(bad)


def test_the_cli_builds_an_aec_board_with_a_room() -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    options = parser.parse_args(["--say", "hi", "--aec", "--echo", "--echo-delay-ms", "80", "--echo-taps", "0:1,9:0.3"])
    device = cli.build_device(options, log=lambda _line: None)
    assert device.features["aec"] is True and device.listen_mode == "realtime"
    assert options.protocol_version == 2
    assert device.echo is not None and device.echo.delay_ms == 80 and device.echo.taps == ((0.0, 1.0), (9.0, 0.3))
    plain = parser.parse_args(["--say", "hi"])
    device = cli.build_device(plain, log=lambda _line: None)
    assert "aec" not in device.features and device.echo is None and device.listen_mode == "auto"
    with pytest.raises(cli.CliError):
        cli.build_device(parser.parse_args(["--say", "hi", "--echo", "--echo-gain", "9"]), log=lambda _line: None)
