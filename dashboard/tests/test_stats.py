"""The mergeable aggregate of turns, without a database."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, UTC

from dashboard import histogram
from dashboard.stats import TIMING_KEYS, Aggregate, GroupKey, TurnRow

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def row(minute: int = 0, *, timings: dict[str, float] | None = None, error: str = "", interrupted: bool = False,
        tool_calls: object = (), apology: bool = False, providers: tuple[str, str, str] = ("a", "l", "t"),
        persona: int | None = 1) -> TurnRow:
    return TurnRow(created_at=T0 + timedelta(minutes=minute), source="device", persona_id=persona,
                   timings=tuple((timings or {}).get(key) for key in TIMING_KEYS), providers=providers,
                   error=error, interrupted=interrupted, tool_calls=list(tool_calls), apology=apology)


def test_it_counts_turns_errors_apologies_and_interruptions() -> None:
    aggregate = Aggregate()
    aggregate.add(row(1))
    aggregate.add(row(2, error="asr: all providers failed", apology=True))
    aggregate.add(row(3, error="llm: timeout"))
    aggregate.add(row(4, error="llm: 500 from upstream"))
    aggregate.add(row(5, error="gateway hiccup", interrupted=True))
    assert (aggregate.turns, aggregate.errors, aggregate.apologies, aggregate.interrupted) == (5, 4, 1, 1)
    assert aggregate.failures == {"asr": 1, "llm": 2}
    assert aggregate.last_error["llm"].text == "llm: 500 from upstream"  # the latest one
    assert aggregate.last_error["other"].text == "gateway hiccup"
    assert aggregate.error_rate == 0.8


def test_it_skips_missing_and_infinite_timings() -> None:
    aggregate = Aggregate()
    aggregate.add(row(timings={"asr_done": 120.5, "tts_first_audio": float("inf")}))
    aggregate.add(row())
    assert set(aggregate.stages) == {"asr_done"}
    assert aggregate.stages["asr_done"].values == [120.5]


def test_tool_calls_are_counted_per_tool_with_the_last_failure() -> None:
    aggregate = Aggregate()
    aggregate.add(row(1, tool_calls=[{"name": "weather", "success": True}, {"name": "lamp", "success": False,
                                                                              "error": "timeout"}]))
    aggregate.add(row(2, tool_calls=[{"name": "lamp", "success": False, "error": "tool_error"}, "junk"]))
    lamp, weather = aggregate.tools["lamp"], aggregate.tools["weather"]
    assert (lamp.calls, lamp.failures, lamp.last_error.text) == (2, 2, "tool_error")
    assert (weather.calls, weather.failures) == (1, 0)


def test_turns_are_grouped_by_source_persona_and_providers() -> None:
    aggregate = Aggregate()
    aggregate.add(row(providers=("a", "l", "edge,espeak")))
    aggregate.add(row(providers=("", "", ""), persona=None))
    assert aggregate.groups == {GroupKey("device", 1, "a", "l", "edge,espeak"): 1,
                                GroupKey("device", None, "", "", ""): 1}


def test_exact_values_give_exact_percentiles_until_a_rollup_is_merged_in() -> None:
    raw = Aggregate()
    for minute, ms in enumerate([100.0, 200.0, 300.0, 400.0]):
        raw.add(row(minute, timings={"first_frame_sent": ms}))
    assert raw.stages["first_frame_sent"].exact and raw.stages["first_frame_sent"].percentile(50) == 200.0
    rolled = Aggregate.from_json(json.loads(json.dumps(raw.to_json())))
    assert not rolled.stages["first_frame_sent"].exact
    combined = Aggregate().merge(raw).merge(rolled)
    stats = combined.stages["first_frame_sent"]
    assert stats.count == 8 and not stats.exact
    # p50 of [100, 100, 200, 200, 300, 300, 400, 400] is 200: the estimate is in 200's bucket.
    assert histogram.bucket_of(stats.percentile(50)) == histogram.bucket_of(200.0)
    assert (stats.smallest, stats.largest) == (100.0, 400.0)


def test_the_json_of_a_rollup_round_trips() -> None:
    aggregate = Aggregate()
    aggregate.add(row(1, timings={"asr_done": 50.0, "first_frame_sent": 700.0}, error="llm: boom",
                      tool_calls=[{"name": "lamp", "success": False, "error": "timeout"}]))
    aggregate.add(row(2, timings={"asr_done": 70.0}, interrupted=True, apology=True))
    data = json.loads(json.dumps(aggregate.to_json()))
    back = Aggregate.from_json(data)
    assert (back.turns, back.errors, back.interrupted, back.apologies) == (2, 1, 1, 1)
    assert back.failures == {"llm": 1}
    assert back.stages["asr_done"].buckets == aggregate.stages["asr_done"].buckets
    assert back.stages["asr_done"].count == 2 and back.stages["first_frame_sent"].largest == 700.0
    assert back.tools["lamp"].failures == 1 and back.tools["lamp"].last_error.text == "timeout"
    assert back.last_error["llm"].at == T0 + timedelta(minutes=1)


def test_merging_hours_equals_counting_them_together() -> None:
    first, second, together = Aggregate(), Aggregate(), Aggregate()
    for minute in range(30):
        sample = row(minute, timings={"first_frame_sent": 10.0 * (minute + 1)}, error="llm: x" if minute % 7 else "")
        (first if minute < 12 else second).add(sample)
        together.add(sample)
    merged = Aggregate.from_json(first.to_json()).merge(Aggregate.from_json(second.to_json()))
    assert merged.turns == together.turns and merged.errors == together.errors
    assert merged.stages["first_frame_sent"].buckets == together.stages["first_frame_sent"].buckets
    for percent in (50, 95, 99):
        exact = together.stages["first_frame_sent"].percentile(percent)
        estimate = merged.stages["first_frame_sent"].percentile(percent)
        assert histogram.bucket_of(estimate) == histogram.bucket_of(exact)
