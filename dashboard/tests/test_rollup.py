"""The hourly rollup and the figures read from it, against hand-computed data."""
from __future__ import annotations

import random
from datetime import datetime, timedelta, UTC

import pytest

from conversations.models import Conversation
from conversations.pipeline.phrases import PHRASES
from dashboard import histogram
from dashboard.models import RollupState, TurnRollup
from dashboard.rows import Scope
from dashboard.selectors import breakdown, latency_figures
from dashboard.services import turns_rollup
from dashboard.tests.data import conversation, tool_call, turn
from conversations.tests.factories import PersonaFactory

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 20, 12, 45, tzinfo=UTC)
STAGES = ("turn_silence_ms", "asr_done", "llm_first_token", "tts_first_audio", "first_frame_sent")


def at(hour: int, minute: int) -> datetime:
    return datetime(2026, 11, 20, hour, minute, tzinfo=UTC)


def test_each_finished_hour_is_rolled_up_per_persona_and_providers() -> None:
    alice, bob = PersonaFactory(), PersonaFactory()
    first, second = conversation(persona=alice), conversation(persona=bob)
    turn(first, at=at(10, 5), timings={"first_frame_sent": 400.0})
    turn(first, at=at(10, 40), timings={"first_frame_sent": 600.0}, error="llm: down")
    turn(second, at=at(10, 50), providers={"asr": "faster_whisper", "llm": "openai", "tts": "edge,espeak"})
    turn(first, at=at(11, 10))
    turn(first, at=at(12, 30))  # the current hour: not finished
    assert turns_rollup(now=NOW) == 2
    rows = {(r.hour.hour, r.persona_id, r.tts): r for r in TurnRollup.objects.filter(is_total=False)}
    assert set(rows) == {(10, alice.pk, "edge"), (10, bob.pk, "edge,espeak"), (11, alice.pk, "edge")}
    ten = rows[(10, alice.pk, "edge")]
    assert ten.turns == 2 and ten.data["errors"] == 1 and ten.data["stages"]["first_frame_sent"]["n"] == 2
    totals = {r.hour.hour: r for r in TurnRollup.objects.filter(is_total=True)}
    assert {hour: (r.source, r.persona_id, r.tts, r.turns) for hour, r in totals.items()} == {
        10: ("device", None, "", 3), 11: ("device", None, "", 1)}
    assert totals[10].data["stages"]["first_frame_sent"]["h"] == ten.data["stages"]["first_frame_sent"]["h"]
    assert RollupState.objects.get().rolled_until == at(12, 0)


def test_a_rerun_rebuilds_recent_hours_without_duplicating_them() -> None:
    conv = conversation()
    turn(conv, at=at(11, 10))
    turns_rollup(now=NOW)
    turn(conv, at=at(11, 59))  # a straggler written after the first run
    turns_rollup(now=NOW + timedelta(minutes=5))
    assert list(TurnRollup.objects.values_list("hour", "is_total", "turns").order_by("is_total")) == [
        (at(11, 0), False, 2), (at(11, 0), True, 2)]


def test_an_hour_is_rolled_up_only_once_it_has_settled() -> None:
    turn(conversation(), at=at(11, 59))
    turns_rollup(now=at(12, 0) + timedelta(seconds=30))
    assert not TurnRollup.objects.exists()
    turns_rollup(now=at(12, 2))
    assert set(TurnRollup.objects.values_list("hour", flat=True)) == {at(11, 0)}


def test_an_empty_database_rolls_up_nothing_and_shows_zeros() -> None:
    assert turns_rollup(now=NOW) == 0
    figures = latency_figures("7d", now=NOW)
    assert figures.all_turns.turns == 0 and figures.series["stages"] == {}
    assert all(stage.count == 0 and stage.p95 is None for stage in figures.device_stages)


def test_odd_json_in_a_turn_is_skipped_not_an_error() -> None:
    conv = conversation()
    turn(conv, at=at(12, 1), timings={"asr_done": 120.5, "first_frame_sent": "fast", "llm_first_token": True,
                                      "tts_first_audio": {"ms": 3}, "made_up": 3},  # type: ignore[dict-item]
         providers={"asr": 7, "tts": ["x"]})  # type: ignore[dict-item]
    turn(conv, at=at(12, 2), timings=["not", "a", "dict"], providers="nothing")  # type: ignore[arg-type]
    turn(conv, at=at(12, 3), tool_calls=[{"name": "lamp"}, "junk", {"success": True}])
    figures = latency_figures("1h", now=NOW)
    counts = {s.key: s.count for s in figures.device_stages}
    assert counts == {"turn_silence_ms": 0, "asr_done": 1, "llm_first_token": 0, "tts_first_audio": 0,
                      "first_frame_sent": 0}
    assert figures.all_turns.turns == 3
    assert {t.name: (t.calls, t.failures) for t in figures.tools} == {"lamp": (1, 1), "?": (1, 0)}


def test_last_hour_percentiles_are_exact_nearest_rank_values() -> None:
    conv = conversation()
    for minute, ms in zip(range(5), [500.0, 100.0, 400.0, 200.0, 300.0], strict=True):
        turn(conv, at=NOW - timedelta(minutes=10 + minute), timings={"first_frame_sent": ms})
    turn(conv, at=NOW - timedelta(minutes=61), timings={"first_frame_sent": 9000.0})  # outside the hour
    stage = {s.key: s for s in latency_figures("1h", now=NOW).device_stages}["first_frame_sent"]
    # sorted: 100 200 300 400 500; ranks ceil(.5*5)=3, ceil(.95*5)=5, ceil(.99*5)=5
    assert (stage.count, stage.p50, stage.p95, stage.p99, stage.exact) == (5, 300.0, 500.0, 500.0, True)


def _random_history(count: int, hours: int, seed: int = 7) -> dict[str, list[float]]:
    """Device turns spread over the last `hours` hours with log-normal stage timings; returns
    the raw values per stage, as the exact reference."""
    rng = random.Random(seed)
    conv = conversation(persona=PersonaFactory())
    values: dict[str, list[float]] = {stage: [] for stage in STAGES}
    for _ in range(count):
        asr = round(rng.lognormvariate(5.0, 0.5), 1)
        timings = {"speech_end": 0.0, "asr_done": asr, "llm_first_token": round(asr + rng.lognormvariate(5.5, 0.6), 1)}
        timings["tts_first_audio"] = round(timings["llm_first_token"] + rng.lognormvariate(4.5, 0.7), 1)
        timings["first_frame_sent"] = round(timings["tts_first_audio"] + rng.uniform(0.5, 20.0), 1)
        timings["turn_silence_ms"] = round(rng.uniform(150.0, 1500.0), 1)
        turn(conv, at=NOW - timedelta(minutes=rng.uniform(0, hours * 60)), timings=timings)
        for stage in STAGES:
            values[stage].append(timings[stage])
    return values


def test_seven_day_figures_from_the_rollup_match_the_raw_rows_within_one_bucket() -> None:
    raw = _random_history(400, hours=60)
    turns_rollup(now=NOW)
    assert TurnRollup.objects.filter(hour__lt=at(12, 0)).exists()
    figures = latency_figures("7d", now=NOW)
    for stage in figures.device_stages:
        assert stage.count == len(raw[stage.key])
        assert not stage.exact  # read from histograms
        for percent, estimate in ((50, stage.p50), (95, stage.p95), (99, stage.p99)):
            exact = histogram.percentile_exact(raw[stage.key], percent)
            assert histogram.bucket_of(estimate) == histogram.bucket_of(exact), (stage.key, percent)


def test_figures_read_from_total_rows_equal_those_read_from_group_rows() -> None:
    persona = PersonaFactory()
    conv = conversation(persona=persona)
    rng = random.Random(11)
    for minute in range(0, 600, 7):
        turn(conv, at=NOW - timedelta(minutes=minute), timings={"first_frame_sent": round(rng.uniform(50, 900), 1)},
             error="llm: x" if minute % 5 == 0 else "")
    turns_rollup(now=NOW)
    overall = latency_figures("24h", now=NOW)  # per-source total rows
    scoped = latency_figures("24h", Scope(persona_id=persona.pk), now=NOW)  # per-group rows
    assert [(s.count, s.p50, s.p95, s.p99) for s in overall.device_stages] == [
        (s.count, s.p50, s.p95, s.p99) for s in scoped.device_stages]
    assert overall.all_turns == scoped.all_turns
    assert [(p.stage, p.provider, p.served) for p in overall.providers] == [
        (p.stage, p.provider, p.served) for p in scoped.providers]


def test_figures_stay_exact_and_complete_when_the_rollup_has_not_run() -> None:
    raw = _random_history(120, hours=30, seed=3)
    figures = latency_figures("7d", now=NOW)  # no rollup at all: every row is read raw
    stage = {s.key: s for s in figures.device_stages}["first_frame_sent"]
    assert stage.exact and stage.count == 120
    assert stage.p95 == histogram.percentile_exact(raw["first_frame_sent"], 95)


def test_hours_not_rolled_up_yet_are_added_from_raw_rows() -> None:
    conv = conversation()
    turn(conv, at=at(9, 30), timings={"first_frame_sent": 100.0})
    turns_rollup(now=at(10, 5))  # rolls up hour 9 only
    turn(conv, at=at(11, 30), timings={"first_frame_sent": 300.0})  # rollup lags: hours 10-12 raw
    turn(conv, at=at(12, 30), timings={"first_frame_sent": 200.0})
    figures = latency_figures("24h", now=NOW)
    stage = {s.key: s for s in figures.device_stages}["first_frame_sent"]
    assert stage.count == 3 and figures.all_turns.turns == 3
    assert histogram.bucket_of(stage.p50) == histogram.bucket_of(200.0)
    labels = figures.series["labels"]
    series = figures.series["stages"]["device.first_frame_sent"]
    assert len(labels) == 25 and labels[-4] == "09:00"
    assert series["n"][-4:] == [1, 0, 1, 1]  # 09:00 from the rollup, 11:00 and 12:00 from raw rows


def test_failures_apologies_tools_and_fallbacks_are_counted_over_the_range() -> None:
    persona = PersonaFactory(tts_providers=["edge", "espeak"])
    conv = conversation(persona=persona)
    apology = PHRASES["apology"]["en"]
    turn(conv, at=at(10, 0), error="asr: all providers failed", reply_text=apology,
         providers={"tts": "espeak"})
    turn(conv, at=at(10, 5), error="llm: timeout", reply_text=apology, providers={"asr": "a", "tts": "espeak"})
    turn(conv, at=at(10, 10), error="llm: broke mid-reply", reply_text="Half an ans",
         providers={"asr": "a", "llm": "openai", "tts": "edge"})
    turn(conv, at=at(11, 0), providers={"asr": "a", "llm": "openai", "tts": "edge,espeak"}, interrupted=True,
         tool_calls=[tool_call("lamp", success=False, error="timeout"), tool_call("weather")])
    turn(conv, at=at(12, 40), providers={"asr": "a", "llm": "openai", "tts": "edge"},
         tool_calls=[tool_call("lamp")])
    turns_rollup(now=NOW)
    figures = latency_figures("24h", now=NOW)
    totals = figures.all_turns
    assert (totals.turns, totals.errors, totals.apologies, totals.interrupted) == (5, 3, 2, 1)
    failures = {f.stage: f for f in figures.stage_failures}
    assert failures["asr"].count == 1 and failures["llm"].count == 2
    assert failures["llm"].last_error == "llm: broke mid-reply" and failures["llm"].last_at == at(10, 10)
    tools = {t.name: t for t in figures.tools}
    assert (tools["lamp"].calls, tools["lamp"].failures, tools["lamp"].last_error) == (2, 1, "timeout")
    tts = {row.provider: row for row in figures.providers if row.stage == "tts"}
    # edge is the first choice of all 5 turns; 3 were served (at least in part) by espeak.
    assert (tts["edge"].served, tts["edge"].preferred, tts["edge"].fallbacks) == (3, 5, 3)
    assert tts["espeak"].served == 3 and tts["espeak"].preferred == 0


def test_breakdowns_split_the_range_per_persona_and_per_provider() -> None:
    alice, bob = PersonaFactory(name="Alice"), PersonaFactory(name="Bob")
    for persona, ms, tts in ((alice, 100.0, "edge"), (alice, 300.0, "edge"), (bob, 900.0, "espeak")):
        turn(conversation(persona=persona), at=at(12, 10), timings={"first_frame_sent": ms},
             providers={"asr": "a", "llm": "l", "tts": tts})
    by_persona = {row.label: row for row in breakdown("1h", "persona", "first_frame_sent", now=NOW)}
    assert by_persona["Alice"].figure.count == 2 and by_persona["Alice"].figure.p50 == 100.0
    assert by_persona["Bob"].figure.p95 == 900.0
    by_provider = {row.label: row for row in breakdown("1h", "provider", "first_frame_sent", now=NOW)}
    assert by_provider["edge"].turns == 2 and by_provider["espeak"].figure.p50 == 900.0
    only_bob = breakdown("1h", "persona", "first_frame_sent", Scope(persona_id=bob.pk), now=NOW)
    assert [row.label for row in only_bob] == ["Bob"]


def test_gateway_turns_are_figured_apart_from_device_turns() -> None:
    gateway = conversation(source=Conversation.SOURCE_GATEWAY)
    turn(gateway, at=at(12, 20), timings={"llm_ms": 42.0, "total_ms": 50.0}, providers={"llm": "openai"})
    turn(conversation(), at=at(12, 21), timings={"first_frame_sent": 700.0})
    figures = latency_figures("1h", now=NOW)
    gateway_stages = {s.key: s for s in figures.gateway_stages}
    assert gateway_stages["llm_ms"].p50 == 42.0 and gateway_stages["total_ms"].count == 1
    assert {s.key: s.count for s in figures.device_stages}["first_frame_sent"] == 1
    assert figures.totals["gateway"].turns == 1 and figures.totals["device"].turns == 1
