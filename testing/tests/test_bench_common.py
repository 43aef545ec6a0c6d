"""The benchmarks' shared helpers (bench/common.py): the hypervisor's steal read from /proc/stat, the
stats records read while the workers append, the load generator's collector."""
from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

# Imported as the benchmark scripts import it (bench/ on the path), so it is one module.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from common import generator_collector_off, steal_seconds, whole_json_lines

STAT = """cpu  71348 0 16226 116917 2058 0 1409 29940 0 0
cpu0 35000 0 8000 58000 1000 0 700 15000 0 0
cpu1 36348 0 8226 58917 1058 0 709 14940 0 0
intr 123456 0 0
"""


def test_steal_is_the_eighth_value_of_the_machine_wide_cpu_line_in_seconds(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    assert steal_seconds(str(stat)) == 29940 / os.sysconf("SC_CLK_TCK")


def test_steal_is_zero_without_the_file_or_the_field(tmp_path: Path) -> None:
    assert steal_seconds(str(tmp_path / "missing")) == 0.0
    old_kernel = tmp_path / "stat"
    old_kernel.write_text("cpu  71348 0 16226 116917\nintr 1\n")  # no steal column
    assert steal_seconds(str(old_kernel)) == 0.0


def test_stats_lines_half_written_by_a_worker_are_left_for_the_next_read(tmp_path: Path) -> None:
    stats = tmp_path / "stats.jsonl"
    stats.write_text('{"message": "hearing stats", "n": 1}\n\n{"message": "hearing stats", "n": 2}\n{"message": "hear')
    assert whole_json_lines(stats) == [{"message": "hearing stats", "n": 1}, {"message": "hearing stats", "n": 2}]
    with stats.open("a") as f:
        f.write('ing stats", "n": 3}\n')
    assert [r["n"] for r in whole_json_lines(stats)] == [1, 2, 3]


def test_the_generator_runs_without_its_collector() -> None:
    thresholds = gc.get_threshold()
    try:
        generator_collector_off()
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.enable()
        gc.set_threshold(*thresholds)
