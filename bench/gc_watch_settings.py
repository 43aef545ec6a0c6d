"""Server settings for a garbage-collection diagnostic: bench.server_settings plus a
`gc.callbacks` hook in every server process.

    BENCH_SETTINGS=bench.gc_watch_settings BENCH_GC_FILE=/tmp/gc.jsonl \
        .venv/bin/python bench/p10_ota_storm.py --workers 2 --redis redis://127.0.0.1:6379/7
    .venv/bin/python bench/gc_watch_settings.py /tmp/gc.jsonl    # the summary per process

Each process appends JSON lines to BENCH_GC_FILE: one per full (generation 2) collection
(its pause, what it collected, the objects it walked) and, every 2 s, its totals per
generation (count, total and longest pause). Not used by the default runs: the hook costs a
few microseconds per collection, and counting the objects of a full collection walks them
again (after the pause is timed). The thresholds are the server's own: xiaozhi_site/asgi.py
sets them after these settings are read (xiaozhi_site/collector.py), so an experiment with
others changes that file's constants.
"""
from __future__ import annotations

import gc
import importlib
import json
import os
import sys
import threading
import time
from typing import Any

if __name__ != "__main__":  # the summary below runs without Django
    # bench.server_settings' settings, by name: mypy checks bench/ as top-level modules, and a
    # plain import of "bench.server_settings" would make it see that file twice.
    _base = importlib.import_module("bench.server_settings")
    globals().update({name: value for name, value in vars(_base).items() if name.isupper()})

TOTALS_EVERY_S = 2.0


class GcWatch:
    """Times every collection; full ones are written as they happen, the rest as totals."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.pid = os.getpid()
        self.count = [0, 0, 0]
        self.total_ms = [0.0, 0.0, 0.0]
        self.max_ms = [0.0, 0.0, 0.0]
        self._started = 0.0
        self._lock = threading.Lock()

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause_ms = (time.perf_counter() - self._started) * 1000
        generation = info["generation"]
        self.count[generation] += 1
        self.total_ms[generation] += pause_ms
        self.max_ms[generation] = max(self.max_ms[generation], pause_ms)
        if generation == 2:
            self.write({"kind": "full", "ms": round(pause_ms, 2), "collected": info["collected"],
                        "walked": len(gc.get_objects(generation=2)), "frozen": gc.get_freeze_count()})

    def totals(self) -> None:
        self.write({"kind": "totals", "count": self.count, "total_ms": [round(v, 1) for v in self.total_ms],
                    "max_ms": [round(v, 2) for v in self.max_ms]})

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"pid": self.pid, "t": round(time.time(), 3), **record}) + "\n"
        with self._lock, open(self.path, "a") as out:  # O_APPEND: the workers' lines do not mix
            out.write(line)

    def every(self, seconds: float) -> None:
        while True:
            time.sleep(seconds)
            self.totals()


def install(path: str) -> GcWatch:
    watch = GcWatch(path)
    gc.callbacks.append(watch)
    threading.Thread(target=watch.every, args=(TOTALS_EVERY_S,), name="gc-watch", daemon=True).start()
    return watch


def summary(path: str) -> None:
    """Per process: full collections (count, pauses, objects walked) and the last totals."""
    by_pid: dict[int, dict[str, Any]] = {}
    with open(path) as lines:
        for line in lines:
            record = json.loads(line)
            entry = by_pid.setdefault(record["pid"], {"full": [], "totals": None})
            if record["kind"] == "full":
                entry["full"].append(record)
            else:
                entry["totals"] = record
    for pid, entry in sorted(by_pid.items()):
        pauses = sorted(r["ms"] for r in entry["full"])
        walked = max((r["walked"] for r in entry["full"]), default=0)
        totals = entry["totals"] or {"count": [0, 0, 0], "total_ms": [0, 0, 0], "max_ms": [0, 0, 0]}
        print(f"pid {pid}: full collections {len(pauses)}, pauses ms {pauses}, most objects walked {walked}; "
              f"per generation count {totals['count']}, total ms {totals['total_ms']}, max ms {totals['max_ms']}")


def _is_web_worker() -> bool:
    # Not manage.py (migrate, shell) nor the runner: only the processes serving requests.
    return any(part.endswith(("daphne/__main__.py", "uvicorn/__main__.py")) for part in sys.argv[:1])


if os.environ.get("BENCH_GC_FILE") and __name__ != "__main__" and _is_web_worker():
    install(os.environ["BENCH_GC_FILE"])

if __name__ == "__main__":
    summary(sys.argv[1])
