"""P2's verdict on a step (bench/p2_streaming.py `Step.ok`), which the overload run shares."""
from __future__ import annotations

import sys
from pathlib import Path

# Imported as the benchmark scripts import their modules (bench/ on the path).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from p2_streaming import LAG_TARGET_MS, Step


def _step(**figures: int) -> Step:
    step = Step(devices=10, connected=6, refused=4, packets=1000)
    step.lag_hist = {int(LAG_TARGET_MS) - 10: 1000}
    for name, value in figures.items():
        setattr(step, name, value)
    return step


def test_a_step_passes_when_every_device_is_admitted_or_refused_and_the_lag_is_on_target() -> None:
    assert _step().ok


def test_a_device_left_unanswered_fails_the_step_however_good_the_lag() -> None:
    assert not _step(refused=3).ok  # one of the ten neither admitted nor told 1013 (held past 10 s)


def test_a_dropped_packet_or_a_late_p99_fails_the_step() -> None:
    assert not _step(dropped=1).ok
    late = _step()
    late.lag_hist = {int(LAG_TARGET_MS) + 10: 1000}
    assert not late.ok
