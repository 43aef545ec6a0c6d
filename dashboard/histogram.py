"""Latency percentiles: exact from raw values, estimated from fixed log-spaced buckets (pure).

Why two ways. Over a short range (the last hour) the dashboard reads every Turn row and
computes percentiles exactly. Over 24 hours or 7 days that would mean reading up to millions of
rows per page load, so a Celery beat task rolls each hour up into histograms with *fixed*
bucket edges. Fixed edges are what makes the long-range figures correct: histograms of
different hours (and of the raw rows of the hour not rolled up yet) add up bucket by bucket
into the histogram of the whole range, and the percentile is read from that sum. Averaging
per-hour percentiles ("average of averages") would be wrong and is never done.

Definition (both ways): the p-th percentile of n values is the nearest-rank value, the
k-th smallest value with k = ceil(p/100 * n) (at least 1). p50 of [1, 2, 3, 4] is 2; p95 of
20 values is the 19th smallest.

Buckets (milliseconds, `STEPS_PER_DOUBLING` = 8):
- bucket 0 holds [0, 1) ms (and anything negative, which only a clock quirk produces);
- bucket i, 1 <= i <= 136, holds [2**((i-1)/8), 2**(i/8)) ms: eight buckets per doubling,
  each 9.05 % wider than its lower edge (1 ms ... 131 s);
- bucket 137 holds everything from 2**17 ms = 131.072 s up.
From a histogram the estimate is interpolated linearly inside the bucket that holds the k-th
value and clamped to the smallest and largest value seen, so it always lies in the same bucket
as the exact nearest-rank value: the error is below one bucket width (< 9.05 %, and never
more than the exact value's own bucket).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

STEPS_PER_DOUBLING = 8
MAX_EXPONENT = 17  # 2**17 ms = 131 s: slower than any timeout in the pipeline
LAST_BUCKET = STEPS_PER_DOUBLING * MAX_EXPONENT + 1  # 137: the overflow bucket
BUCKET_COUNT = LAST_BUCKET + 1
PERCENTILES = (50, 95, 99)


# _EDGES[i] is the lower edge of bucket i + 1: 2**(i/8) ms for i = 0..136.
_EDGES = [2.0 ** (i / STEPS_PER_DOUBLING) for i in range(LAST_BUCKET)]
_TOP = 2.0**MAX_EXPONENT


def bucket_lower(index: int) -> float:
    """Lower edge of a bucket in ms (inclusive)."""
    if index <= 0:
        return 0.0
    return _EDGES[min(index, LAST_BUCKET) - 1]


def bucket_upper(index: int) -> float:
    """Upper edge of a bucket in ms (exclusive); infinite for the overflow bucket."""
    if index >= LAST_BUCKET:
        return math.inf
    return _EDGES[index]


def bucket_of(ms: float) -> int:
    """The bucket holding `ms`; NaN is not a latency and raises ValueError."""
    if ms < 1.0:
        if ms != ms:
            raise ValueError("NaN is not a latency")
        return 0
    if ms >= _TOP:
        if ms != ms:
            raise ValueError("NaN is not a latency")
        return LAST_BUCKET
    index = 1 + int(STEPS_PER_DOUBLING * math.log2(ms))
    # log2 rounding can put a value sitting on an edge one bucket off: settle it on the edges.
    if ms < _EDGES[index - 1]:
        index -= 1
    elif index < LAST_BUCKET and ms >= _EDGES[index]:
        index += 1
    return index


def nearest_rank(count: int, percent: int) -> int:
    """k = ceil(percent/100 * count), at least 1; integer arithmetic, so p95 of 20 is 19, not 20."""
    if count <= 0:
        raise ValueError("no values")
    if not 0 < percent <= 100:
        raise ValueError("percent must be in (0, 100]")
    return max(1, -(-percent * count // 100))


def percentile_exact(values: Sequence[float], percent: int) -> float | None:
    """Nearest-rank percentile of raw values; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[nearest_rank(len(ordered), percent) - 1]


def percentile_from_histogram(
    counts: Mapping[int, int], percent: int, *, smallest: float | None = None, largest: float | None = None
) -> float | None:
    """Nearest-rank percentile estimated from bucket counts; None when they are empty.

    Inside the bucket that holds the k-th value, the j-th of its c values is placed at
    lower + (upper - lower) * (j - 0.5) / c, then clamped to [smallest, largest] when known.
    """
    return percentiles_from_histogram(counts, (percent,), smallest=smallest, largest=largest)[percent]


def percentiles_from_histogram(
    counts: Mapping[int, int], percents: Sequence[int], *, smallest: float | None = None,
    largest: float | None = None,
) -> dict[int, float | None]:
    """Several percentiles in one walk over the buckets (the charts need p50 and p95 of every bin)."""
    occupied = sorted((index, count) for index, count in counts.items() if count > 0)
    total = sum(count for _, count in occupied)
    if total == 0:
        return dict.fromkeys(percents)
    wanted = sorted((nearest_rank(total, percent), percent) for percent in percents)
    found: dict[int, float | None] = {}
    seen, position = 0, 0
    for index, count in occupied:
        while position < len(wanted) and wanted[position][0] <= seen + count:
            rank, percent = wanted[position]
            found[percent] = _clamp(_inside(index, rank - seen, count), smallest, largest)
            position += 1
        seen += count
    return found


def _inside(index: int, position: int, count: int) -> float:
    lower, upper = bucket_lower(index), bucket_upper(index)
    if math.isinf(upper):
        return lower
    return lower + (upper - lower) * (position - 0.5) / count


def _clamp(value: float, smallest: float | None, largest: float | None) -> float:
    if smallest is not None:
        value = max(value, smallest)
    if largest is not None:
        value = min(value, largest)
    return value


def histogram_of(values: Iterable[float]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for value in values:
        index = bucket_of(value)
        counts[index] = counts.get(index, 0) + 1
    return counts


def display_bins(counts: Mapping[int, int], *, merge: int = 4) -> list[tuple[float, float, int]]:
    """Coarser bins for the histogram chart: `merge` buckets per bin (4 = two bins per
    doubling), trimmed to the occupied span. Each bin is (lower ms, upper ms, count)."""
    occupied = [index for index, count in counts.items() if count > 0]
    if not occupied:
        return []
    first, last = min(occupied) // merge, max(occupied) // merge
    bins: list[tuple[float, float, int]] = []
    for group in range(first, last + 1):
        members = range(group * merge, min(group * merge + merge, BUCKET_COUNT))
        total = sum(counts.get(index, 0) for index in members)
        bins.append((bucket_lower(members[0]), bucket_upper(members[-1]), total))
    return bins
