"""The garbage collector of a web worker: tuned for thousands of long-lived device sessions.

Measured in a reboot storm (docs/performance.md, P10, third pass; bench/gc_watch_settings.py):
with Python's default thresholds (700, 10, 10) each of two workers ran ~27 full collections
while 2,500 sessions each arrived, every one walking the whole heap of live sessions (up to
~1 million objects, 0.3-1.4 s with the event loop stopped): ~10 s of a worker's CPU, and the
pauses made admission refuse devices for lag. Most of a session's objects live as long as
its socket, so examining them again and again finds nothing; the count that triggers a young
collection is the net growth of tracked objects, and thousands of new sessions grow it fast.
"""
from __future__ import annotations

import gc

# Net new container objects before a young collection (Python's default: 700). Full
# collections then come ~14 times less often (the older generations' thresholds count
# younger collections); the cyclic garbage of closed sessions waits a little longer in
# memory (at most this many objects in the youngest generation).
YOUNG_THRESHOLD = 10_000


def settle_heap(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Call once, after start-up: everything imported so far lives as long as the process,
    so it leaves the collector's reach (full collections then walk only per-session objects;
    P1 tail: 110-175 ms → ~20 ms), and young collections run less often."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
