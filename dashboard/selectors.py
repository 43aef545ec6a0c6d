"""Latency and failure figures over a range: raw rows where that is cheap, hourly rollups
where it is not (histogram.py and rows.py say why the two add up correctly).

Ranges: "1h" is the last 60 minutes, read from raw rows, so its percentiles are exact.
"24h" and "7d" start at the top of the hour 24 hours / 7 days ago (so they span 24-25 hours /
7 days and up to an hour), read from the rollup for the hours it has and from raw rows for the
rest (the current hour at least); their percentiles come from the merged histograms unless
every value came from raw rows.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, UTC
from typing import Any, Generic, TypeVar

from django.utils import dateformat, timezone
from django.utils.translation import gettext_lazy as _

from conversations.models import Conversation, Persona
from conversations.provider_configs import persona_first_kinds
from dashboard import histogram
from dashboard.rows import HOUR, Scope, floor_hour, rolled_until, rollup_group_turns, rollups_between, turn_rows
from dashboard.stats import FAILED_STAGES, PROVIDER_STAGES, Aggregate, GroupKey, LastError

RANGES: dict[str, timedelta] = {"1h": timedelta(hours=1), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
RANGE_LABELS = {"1h": _("Last hour"), "24h": _("24 hours"), "7d": _("7 days")}
DEFAULT_RANGE = "24h"
FIVE_MINUTES = timedelta(minutes=5)

STAGE_LABELS = {
    # The quiet heard after the user's last word before the turn ended (fixed window or Smart Turn).
    "turn_silence_ms": _("End of speech → turn ended"),
    "asr_done": _("End of speech → ASR done"),
    "llm_first_token": _("End of speech → LLM first token"),
    "tts_first_audio": _("End of speech → TTS first audio"),
    "first_frame_sent": _("End of speech → first frame sent"),
    "last_frame_sent": _("End of speech → last frame sent"),
    "llm_ms": _("LLM time (all rounds)"),
    "total_ms": _("Text in → reply done"),
}
GATEWAY_STAGE_LABELS = {"llm_first_token": _("Text in → LLM first token")}
DEVICE_STAGES = ("turn_silence_ms", "asr_done", "llm_first_token", "tts_first_audio", "first_frame_sent")
GATEWAY_STAGES = ("llm_first_token", "llm_ms", "total_ms")
HISTOGRAM_STAGE = "first_frame_sent"
STAGE_PROVIDER = {"asr_done": "asr", "llm_first_token": "llm", "llm_ms": "llm", "total_ms": "llm",
                  "tts_first_audio": "tts", "first_frame_sent": "tts", "last_frame_sent": "tts"}
SOURCES = (Conversation.SOURCE_DEVICE, Conversation.SOURCE_GATEWAY)


# -- folding rows and rollups ------------------------------------------------------------------


K = TypeVar("K", bound=Hashable)  # what fold() adds turns up by: a (source, bin) pair, a persona id, ...


def range_start(range_name: str, now: datetime) -> datetime:
    span = RANGES[range_name]
    return now - span if range_name == "1h" else floor_hour(now - span)


def bin_of(range_name: str, moment: datetime) -> datetime:
    """The chart bin of a moment: 5 minutes for the last hour, hours otherwise."""
    if range_name == "1h":
        moment = moment.astimezone(UTC)
        return moment.replace(minute=moment.minute - moment.minute % 5, second=0, microsecond=0)
    return floor_hour(moment)


@dataclass
class Folded(Generic[K]):
    aggregates: dict[K, Aggregate]
    groups: dict[GroupKey, int]  # turns per group over the whole range


def fold(range_name: str, scope: Scope, now: datetime, key_of: Callable[[GroupKey, datetime], K], *,
         by_group: bool = True) -> Folded[K]:
    """Every turn of the range, added into the aggregate named by key_of(group, bin).

    Without `by_group` (and without a persona scope) the rollup's per-source total rows are
    read instead of its per-group rows, and key_of gets a group with only the source set; the
    turns per group then come from the database as plain sums."""
    start = range_start(range_name, now)
    folded: dict[K, Aggregate] = defaultdict(Aggregate)
    groups: dict[GroupKey, int] = {}
    raw_from = start
    if range_name != "1h":
        raw_from = max(start, min(rolled_until() or start, floor_hour(now)))
        totals = not by_group and scope.persona_id is None
        for hour, group, data in rollups_between(start, raw_from, scope, totals=totals):
            folded[key_of(group, hour)].merge_json(data, None if totals else group)
        if totals:
            groups = rollup_group_turns(start, raw_from, scope)
    for row in turn_rows(raw_from, None, scope):
        folded[key_of(row.group, bin_of(range_name, row.created_at))].add(row)
    for aggregate in folded.values():
        for group, turns in aggregate.groups.items():
            groups[group] = groups.get(group, 0) + turns
    return Folded(folded, groups)


def merged(aggregates: Any) -> Aggregate:
    total = Aggregate()
    for aggregate in aggregates:
        total.merge(aggregate)
    return total


# -- figures -------------------------------------------------------------------------------------


@dataclass
class StageFigure:
    key: str
    label: str
    count: int
    p50: float | None
    p95: float | None
    p99: float | None
    exact: bool

    @classmethod
    def of(cls, key: str, aggregate: Aggregate, labels: dict[str, Any] | None = None) -> StageFigure:
        stats = aggregate.stages.get(key)
        label = str((labels or {}).get(key) or STAGE_LABELS[key])
        if stats is None or stats.count == 0:
            return cls(key, label, 0, None, None, None, True)
        found = stats.percentiles((50, 95, 99))
        return cls(key, label, stats.count, found[50], found[95], found[99], stats.exact)


@dataclass
class SourceTotals:
    turns: int = 0
    errors: int = 0
    interrupted: int = 0
    apologies: int = 0

    @property
    def error_rate(self) -> float:
        return self.errors / self.turns if self.turns else 0.0


@dataclass
class StageFailure:
    stage: str
    count: int
    rate: float
    last_at: datetime | None
    last_error: str


@dataclass
class ProviderRow:
    stage: str
    provider: str
    served: int = 0
    preferred: int = 0  # turns whose persona names this provider first
    fallbacks: int = 0  # ... and that another provider served (in part or whole)

    @property
    def fallback_rate(self) -> float:
        return self.fallbacks / self.preferred if self.preferred else 0.0


@dataclass
class ToolRow:
    name: str
    calls: int
    failures: int
    last_at: datetime | None
    last_error: str

    @property
    def failure_rate(self) -> float:
        return self.failures / self.calls if self.calls else 0.0


@dataclass
class Figures:
    range: str
    start: datetime
    now: datetime
    totals: dict[str, SourceTotals]
    device_stages: list[StageFigure]
    gateway_stages: list[StageFigure]
    series: dict[str, Any]  # chart data: labels and p50/p95 per stage and source
    histogram: list[dict[str, Any]]
    stage_failures: list[StageFailure]
    providers: list[ProviderRow]
    tools: list[ToolRow]
    all_turns: SourceTotals = field(default_factory=SourceTotals)

    @property
    def exact(self) -> bool:
        """True when every percentile shown came from raw values, none from histograms."""
        return all(stage.exact for stage in (*self.device_stages, *self.gateway_stages))


def latency_figures(range_name: str, scope: Scope = Scope(), now: datetime | None = None) -> Figures:
    now = now or timezone.now()
    folded = fold(range_name, scope, now, lambda group, moment: (group.source, moment), by_group=False)
    by_bin = folded.aggregates
    per_source = {source: merged(a for (s, _moment), a in by_bin.items() if s == source) for source in SOURCES}
    everything = merged(per_source.values())
    return Figures(
        range=range_name, start=range_start(range_name, now), now=now,
        totals={source: _totals(per_source[source]) for source in SOURCES},
        all_turns=_totals(everything),
        device_stages=[StageFigure.of(key, per_source["device"]) for key in DEVICE_STAGES],
        gateway_stages=[StageFigure.of(key, per_source["gateway"], GATEWAY_STAGE_LABELS) for key in GATEWAY_STAGES],
        series=_series(range_name, now, by_bin),
        histogram=_histogram(per_source["device"]),
        stage_failures=_stage_failures(everything),
        providers=_providers(folded.groups),
        tools=_tools(everything),
    )


def _totals(aggregate: Aggregate) -> SourceTotals:
    return SourceTotals(aggregate.turns, aggregate.errors, aggregate.interrupted, aggregate.apologies)


def _bins(range_name: str, now: datetime) -> list[datetime]:
    step = FIVE_MINUTES if range_name == "1h" else HOUR
    moment, last = bin_of(range_name, range_start(range_name, now)), bin_of(range_name, now)
    bins = []
    while moment <= last:
        bins.append(moment)
        moment += step
    return bins


def _label(range_name: str, moment: datetime) -> str:
    # dateformat directly: formats.date_format looks the format up per call (~0.4 ms each).
    return dateformat.format(timezone.localtime(moment), "D H:i" if range_name == "7d" else "H:i")


def _series(range_name: str, now: datetime, by_bin: dict[tuple[str, datetime], Aggregate]) -> dict[str, Any]:
    bins = _bins(range_name, now)
    stages: dict[str, Any] = {}
    for source, keys in (("device", DEVICE_STAGES), ("gateway", GATEWAY_STAGES)):
        for key in keys:
            points = [by_bin[(source, moment)].stages.get(key) if (source, moment) in by_bin else None
                      for moment in bins]
            if not any(stats and stats.count for stats in points):
                continue
            figures = [stats.percentiles((50, 95)) if stats else {} for stats in points]
            stages[f"{source}.{key}"] = {
                "source": source, "stage": key,
                "label": str((GATEWAY_STAGE_LABELS if source == "gateway" else {}).get(key) or STAGE_LABELS[key]),
                "p50": [_round(f.get(50)) for f in figures],
                "p95": [_round(f.get(95)) for f in figures],
                "n": [stats.count if stats else 0 for stats in points],
            }
    return {"labels": [_label(range_name, moment) for moment in bins], "stages": stages}


def _histogram(aggregate: Aggregate) -> list[dict[str, Any]]:
    stats = aggregate.stages.get(HISTOGRAM_STAGE)
    if stats is None:
        return []
    return [{"from": _round(lower), "to": _round(upper), "count": count}
            for lower, upper, count in histogram.display_bins(stats.buckets)]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _stage_failures(aggregate: Aggregate) -> list[StageFailure]:
    rows = []
    for stage in (*FAILED_STAGES, "other"):
        count = aggregate.failures.get(stage, 0) if stage != "other" else aggregate.errors - sum(
            aggregate.failures.values())
        last = aggregate.last_error.get(stage, LastError())
        rate = count / aggregate.turns if aggregate.turns else 0.0
        rows.append(StageFailure(stage, count, rate, last.at, last.text))
    return rows


def _first_choices(persona_ids: set[int]) -> dict[int, dict[str, str]]:
    return persona_first_kinds(persona_ids)


def _providers(groups: dict[GroupKey, int]) -> list[ProviderRow]:
    """Who served each stage, and how often a persona's first choice had to be replaced.

    The pipeline records the provider kinds that produced a stage's output ("edge,espeak" when
    some sentences came from the fallback); a persona's first choice is read from the persona
    as it is now."""
    firsts = _first_choices({g.persona_id for g in groups if g.persona_id is not None})
    rows: dict[tuple[str, str], ProviderRow] = {}

    def row(stage: str, provider: str) -> ProviderRow:
        return rows.setdefault((stage, provider), ProviderRow(stage, provider))

    for group, turns in groups.items():
        for stage in PROVIDER_STAGES:
            recorded = getattr(group, stage)
            kinds = [kind for kind in recorded.split(",") if kind]
            for kind in kinds:
                row(stage, kind).served += turns
            first = firsts.get(group.persona_id or 0, {}).get(stage) if group.source == "device" else ""
            if first and kinds:
                row(stage, first).preferred += turns
                if kinds != [first]:
                    row(stage, first).fallbacks += turns
    order = {stage: index for index, stage in enumerate(PROVIDER_STAGES)}
    return sorted(rows.values(), key=lambda r: (order[r.stage], -r.served, r.provider))


def _tools(aggregate: Aggregate) -> list[ToolRow]:
    rows = [ToolRow(name, tool.calls, tool.failures, tool.last_error.at, tool.last_error.text)
            for name, tool in aggregate.tools.items()]
    return sorted(rows, key=lambda r: (-r.failures, -r.calls, r.name))


# -- breakdowns (per persona, per provider) ------------------------------------------------------


@dataclass
class BreakdownRow:
    key: str
    label: str
    figure: StageFigure
    turns: int
    errors: int


def breakdown(range_name: str, by: str, stage: str, scope: Scope = Scope(),
              now: datetime | None = None) -> list[BreakdownRow]:
    """One row per persona (by="persona") or per provider of the stage (by="provider")."""
    now = now or timezone.now()
    provider_stage = STAGE_PROVIDER[stage]

    def key_of(group: GroupKey, moment: datetime) -> int | str | None:
        if by == "persona":
            return group.persona_id
        return getattr(group, provider_stage)

    folded = fold(range_name, scope, now, key_of).aggregates
    names = dict(Persona.objects.filter(pk__in=[k for k in folded if isinstance(k, int)]).values_list("pk", "name"))
    rows = []
    for key, aggregate in folded.items():
        if by == "persona":
            label = names.get(key, str(_("(no persona)"))) if isinstance(key, int) else str(_("(no persona)"))
        else:
            label = str(key) if key else str(_("(none recorded)"))
        rows.append(BreakdownRow("" if key is None else str(key), label, StageFigure.of(stage, aggregate),
                                 aggregate.turns, aggregate.errors))
    return sorted(rows, key=lambda r: (-r.turns, r.label))


# -- JSON ------------------------------------------------------------------------------------------


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _stage_json(figure: StageFigure) -> dict[str, Any]:
    return {"stage": figure.key, "label": figure.label, "n": figure.count, "p50": _round(figure.p50),
            "p95": _round(figure.p95), "p99": _round(figure.p99), "exact": figure.exact}


def figures_json(figures: Figures) -> dict[str, Any]:
    """The data endpoint's body: every latency and failure figure of the page, numbers only."""
    totals = {source: {"turns": t.turns, "errors": t.errors, "error_rate": round(t.error_rate, 4),
                       "interrupted": t.interrupted, "apologies": t.apologies}
              for source, t in figures.totals.items()}
    return {
        "range": figures.range, "start": _iso(figures.start), "now": _iso(figures.now), "totals": totals,
        "latency": {"device": [_stage_json(f) for f in figures.device_stages],
                    "gateway": [_stage_json(f) for f in figures.gateway_stages]},
        "series": figures.series, "histogram": figures.histogram,
        "failures": [{"stage": f.stage, "turns": f.count, "rate": round(f.rate, 4), "last_at": _iso(f.last_at),
                      "last_error": f.last_error} for f in figures.stage_failures],
        "providers": [{"stage": p.stage, "provider": p.provider, "served": p.served, "preferred": p.preferred,
                       "fallbacks": p.fallbacks, "fallback_rate": round(p.fallback_rate, 4)}
                      for p in figures.providers],
        "tools": [{"name": t.name, "calls": t.calls, "failures": t.failures,
                   "failure_rate": round(t.failure_rate, 4), "last_at": _iso(t.last_at), "last_error": t.last_error}
                  for t in figures.tools],
    }
