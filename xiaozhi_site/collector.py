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
# Young collections before a middle one (Python's default: 10). A middle collection walks the
# survivors of every young collection since the last: while devices arrive that is their new
# sessions, and ten young generations' worth stopped both workers at once for up to 50-86 ms
# in P2 --overload (session 45: 32 middle collections a worker, 105-193 ms in all); with three,
# 78 of them took at most 18-40 ms (90-145 ms in all), and no full collection ran in either.
MIDDLE_THRESHOLD = 3
# Middle collections before a full one (Python's default: 10): 30 x 3 = 90 young collections,
# the cadence full collections had with 10 x 10 (Python also waits until the survivors since
# the last full one are a quarter of the old heap).
OLD_THRESHOLD = 30


def settle_heap(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Call once, after start-up: everything imported so far lives as long as the process,
    so it leaves the collector's reach (full collections then walk only per-session objects;
    P1 tail: 110-175 ms → ~20 ms), and young collections run less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(young_threshold, MIDDLE_THRESHOLD, OLD_THRESHOLD)
