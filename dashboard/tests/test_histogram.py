"""Percentiles: the nearest-rank definition, the fixed buckets, and the histogram estimate
staying in the exact value's bucket."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dashboard import histogram as h


def test_the_buckets_are_log_spaced_with_eight_per_doubling() -> None:
    assert h.bucket_of(0.0) == 0 and h.bucket_of(0.999) == 0 and h.bucket_of(-3.0) == 0
    assert h.bucket_of(1.0) == 1
    assert h.bucket_of(2.0) == 9  # one doubling = eight buckets
    assert h.bucket_of(1000.0) == 80  # 2**(79/8) = 939.0 <= 1000 < 2**(80/8) = 1024
    assert h.bucket_of(2.0**17) == h.LAST_BUCKET == 137
    assert h.bucket_of(1e9) == h.LAST_BUCKET
    assert h.bucket_lower(80) == pytest.approx(939.01, abs=0.01) and h.bucket_upper(80) == 1024.0
    assert math.isinf(h.bucket_upper(h.LAST_BUCKET))


def test_every_bucket_edge_falls_into_its_own_bucket() -> None:
    for index in range(1, h.LAST_BUCKET + 1):
        assert h.bucket_of(h.bucket_lower(index)) == index
        assert h.bucket_of(math.nextafter(h.bucket_lower(index), 0)) == index - 1


def test_a_nan_is_not_a_latency() -> None:
    with pytest.raises(ValueError):
        h.bucket_of(float("nan"))


def test_the_nearest_rank_is_computed_in_integers() -> None:
    assert h.nearest_rank(4, 50) == 2
    assert h.nearest_rank(20, 95) == 19  # 0.95 * 20 is 19.000000000000004 in floats
    assert h.nearest_rank(100, 99) == 99
    assert h.nearest_rank(1, 50) == 1
    assert h.nearest_rank(3, 50) == 2
    with pytest.raises(ValueError):
        h.nearest_rank(0, 50)
    with pytest.raises(ValueError):
        h.nearest_rank(5, 0)


def test_exact_percentiles_match_hand_computed_values() -> None:
    assert h.percentile_exact([40.0, 10.0, 30.0, 20.0], 50) == 20.0
    assert h.percentile_exact([40.0, 10.0, 30.0, 20.0], 95) == 40.0
    values = [float(v) for v in range(1, 21)]  # 1..20
    assert h.percentile_exact(values, 50) == 10.0
    assert h.percentile_exact(values, 95) == 19.0
    assert h.percentile_exact(values, 99) == 20.0
    assert h.percentile_exact([], 50) is None


def test_a_histogram_of_one_value_gives_that_value_back() -> None:
    counts = h.histogram_of([123.4])
    assert h.percentile_from_histogram(counts, 95, smallest=123.4, largest=123.4) == 123.4


def test_the_histogram_estimate_interpolates_inside_the_bucket() -> None:
    # Four values in bucket 80 [939.0, 1024): p50 is the 2nd of 4 → lower + width * 1.5 / 4.
    counts = {80: 4}
    lower, upper = h.bucket_lower(80), h.bucket_upper(80)
    assert h.percentile_from_histogram(counts, 50) == pytest.approx(lower + (upper - lower) * 1.5 / 4)
    # Hand-computed: 10 values below 1 ms and 10 in bucket 80 → p50 is in the first bucket, p95
    # the 19th value = the 9th of 10 in bucket 80.
    counts = {0: 10, 80: 10}
    assert h.percentile_from_histogram(counts, 50) == pytest.approx(0.95)
    assert h.percentile_from_histogram(counts, 95) == pytest.approx(lower + (upper - lower) * 8.5 / 10)
    assert h.percentile_from_histogram({}, 50) is None


def test_the_overflow_bucket_reports_its_lower_edge_or_the_largest_value() -> None:
    assert h.percentile_from_histogram({h.LAST_BUCKET: 3}, 99) == 2.0**17
    assert h.percentile_from_histogram({h.LAST_BUCKET: 3}, 99, largest=150_000.0) == 2.0**17


latencies = st.lists(st.floats(min_value=0.0, max_value=200_000.0, allow_nan=False), min_size=1, max_size=400)


@settings(max_examples=200, deadline=None)
@given(latencies, st.sampled_from([1, 50, 90, 95, 99, 100]))
def test_the_histogram_estimate_is_in_the_bucket_of_the_exact_percentile(values: list[float], percent: int) -> None:
    exact = h.percentile_exact(values, percent)
    estimate = h.percentile_from_histogram(h.histogram_of(values), percent, smallest=min(values), largest=max(values))
    assert exact is not None and estimate is not None
    assert h.bucket_of(estimate) == h.bucket_of(exact)
    if h.bucket_of(exact) not in (0, h.LAST_BUCKET):
        assert abs(estimate - exact) / exact < 2 ** (1 / 8) - 1  # under one bucket width: 9.05 %


def test_display_bins_merge_four_buckets_and_trim_empty_ends() -> None:
    counts = h.histogram_of([1.0, 1.1, 2.0, 1000.0])
    bins = h.display_bins(counts)
    assert bins[0][0] == 0.0 and bins[0][2] == 2  # buckets 0-3 hold 1.0 and 1.1
    assert sum(count for _, _, count in bins) == 4
    assert bins[-1][0] <= 1000.0 < bins[-1][1] and bins[-1][2] == 1
    assert h.display_bins({}) == []


@settings(max_examples=100, deadline=None)
@given(latencies)
def test_several_percentiles_in_one_walk_equal_one_at_a_time(values: list[float]) -> None:
    counts = h.histogram_of(values)
    together = h.percentiles_from_histogram(counts, (99, 50, 95), smallest=min(values), largest=max(values))
    assert together == {p: h.percentile_from_histogram(counts, p, smallest=min(values), largest=max(values))
                        for p in (50, 95, 99)}
