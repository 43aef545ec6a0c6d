"""What the dashboard counts about a set of turns, as one mergeable value (pure: no ORM).

`Aggregate` is filled from raw Turn rows (`add`) or from hourly rollups (`from_json`), and
aggregates of any hours or groups `merge` into the aggregate of their union: counters add,
histograms add bucket by bucket (histogram.py explains why that keeps percentiles correct),
the latest error wins. Exact values are kept while every part came from raw rows and there
are not too many of them, so short ranges get exact percentiles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from dashboard import histogram

# Turn.timings keys the dashboard reads (ms after the end of the user's speech; gateway turns
# record llm_ms and total_ms from the text arriving, and llm_first_token if the gateway does).
TIMING_KEYS = ("asr_done", "llm_first_token", "tts_first_audio", "first_frame_sent", "last_frame_sent",
               "llm_ms", "total_ms", "turn_silence_ms")
PROVIDER_STAGES = ("asr", "llm", "tts")
FAILED_STAGES = ("asr", "llm")  # the pipeline writes "asr: ..." / "llm: ..." into Turn.error
EXACT_LIMIT = 100_000  # above this many values per stage, exact values are dropped (memory)
MAX_TEXT = 200


class GroupKey(NamedTuple):
    """What an hourly rollup row is keyed by besides the hour."""

    source: str
    persona_id: int | None
    asr: str
    llm: str
    tts: str


@dataclass(frozen=True)
class TurnRow:
    """What the dashboard reads of one Turn (rows.turn_rows picks it out in the database)."""

    created_at: datetime
    source: str
    persona_id: int | None
    error: str
    interrupted: bool
    tool_calls: Any
    apology: bool
    providers: tuple[str, ...] = ("", "", "")  # per PROVIDER_STAGES, as recorded ("edge,espeak")
    timings: tuple[float | None, ...] = ()  # per TIMING_KEYS; None where the turn has none

    @property
    def group(self) -> GroupKey:
        return GroupKey(self.source, self.persona_id, *self.providers)


@dataclass
class StageStats:
    count: int = 0
    smallest: float | None = None
    largest: float | None = None
    buckets: dict[int, int] = field(default_factory=dict)
    values: list[float] | None = field(default_factory=list)  # None: not exact any more

    def add(self, ms: float) -> None:
        self.count += 1
        if self.smallest is None or ms < self.smallest:
            self.smallest = ms
        if self.largest is None or ms > self.largest:
            self.largest = ms
        index = histogram.bucket_of(ms)
        self.buckets[index] = self.buckets.get(index, 0) + 1
        if self.values is not None:
            self.values.append(ms)
            if len(self.values) > EXACT_LIMIT:
                self.values = None

    def _extend(self, count: int, smallest: float | None, largest: float | None) -> None:
        self.count += count
        if smallest is not None:
            self.smallest = smallest if self.smallest is None else min(self.smallest, smallest)
        if largest is not None:
            self.largest = largest if self.largest is None else max(self.largest, largest)

    def merge(self, other: StageStats) -> None:
        if other.count == 0:
            return
        self._extend(other.count, other.smallest, other.largest)
        buckets = self.buckets
        for index, count in other.buckets.items():
            buckets[index] = buckets.get(index, 0) + count
        if self.values is None or other.values is None or len(self.values) + len(other.values) > EXACT_LIMIT:
            self.values = None
        else:
            self.values.extend(other.values)

    def merge_json(self, data: dict[str, Any]) -> None:
        """Add a rollup's stage (to_json's shape); the values are no longer all known."""
        self._extend(int(data["n"]), data.get("min"), data.get("max"))
        buckets = self.buckets
        pairs = iter(data.get("h", ()))
        for index, count in zip(pairs, pairs, strict=False):
            buckets[index] = buckets.get(index, 0) + count
        self.values = None

    @property
    def exact(self) -> bool:
        return self.values is not None

    def percentile(self, percent: int) -> float | None:
        return self.percentiles((percent,))[percent]

    def percentiles(self, percents: tuple[int, ...]) -> dict[int, float | None]:
        if self.count == 0:
            return dict.fromkeys(percents)
        if self.values is not None:
            ordered = sorted(self.values)
            return {p: ordered[histogram.nearest_rank(len(ordered), p) - 1] for p in percents}
        return histogram.percentiles_from_histogram(self.buckets, percents, smallest=self.smallest,
                                                    largest=self.largest)

    def to_json(self) -> dict[str, Any]:
        """Buckets as a flat [index, count, index, count, ...] list of the occupied ones:
        the cheapest shape to parse and add up by the hundred."""
        pairs = [number for item in sorted(self.buckets.items()) for number in item]
        return {"n": self.count, "min": self.smallest, "max": self.largest, "h": pairs}


@dataclass
class LastError:
    at: datetime | None = None
    text: str = ""

    def offer(self, at: datetime | None, text: str) -> None:
        if text and at is not None and (self.at is None or at > self.at):
            self.at, self.text = at, text[:MAX_TEXT]

    def offer_json(self, data: list[Any] | None) -> None:
        if data:
            self.offer(datetime.fromisoformat(data[0]), str(data[1]))

    def to_json(self) -> list[Any] | None:
        return [self.at.isoformat(), self.text] if self.at is not None else None


@dataclass
class ToolStats:
    calls: int = 0
    failures: int = 0
    last_error: LastError = field(default_factory=LastError)

    def merge(self, other: ToolStats) -> None:
        self.calls += other.calls
        self.failures += other.failures
        self.last_error.offer(other.last_error.at, other.last_error.text)


@dataclass
class Aggregate:
    turns: int = 0
    errors: int = 0
    interrupted: int = 0
    apologies: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # stage -> turns where all providers failed
    last_error: dict[str, LastError] = field(default_factory=dict)  # stage ("asr", "llm", "other")
    stages: dict[str, StageStats] = field(default_factory=dict)
    tools: dict[str, ToolStats] = field(default_factory=dict)
    groups: dict[GroupKey, int] = field(default_factory=dict)  # turns per (source, persona, providers)

    # -- filling ------------------------------------------------------------------------------

    def add(self, row: TurnRow) -> None:
        self.turns += 1
        self.interrupted += bool(row.interrupted)
        self.apologies += bool(row.apology)
        group = row.group
        self.groups[group] = self.groups.get(group, 0) + 1
        if row.error:
            self._add_error(row.created_at, row.error)
        for key, value in zip(TIMING_KEYS, row.timings, strict=False):
            if value is not None and math.isfinite(value):
                self.stage(key).add(value)
        for call in row.tool_calls if isinstance(row.tool_calls, list) else ():
            if isinstance(call, dict):
                self._add_tool_call(row.created_at, call)

    def _add_error(self, at: datetime, error: str) -> None:
        self.errors += 1
        stage = error.split(":", 1)[0].strip() if ":" in error else ""
        stage = stage if stage in FAILED_STAGES else "other"
        if stage != "other":
            self.failures[stage] = self.failures.get(stage, 0) + 1
        self.last_error.setdefault(stage, LastError()).offer(at, error)

    def _add_tool_call(self, at: datetime, call: dict[str, Any]) -> None:
        name = str(call.get("name") or "?")[:MAX_TEXT]
        stats = self.tools.setdefault(name, ToolStats())
        stats.calls += 1
        if not call.get("success", False):
            stats.failures += 1
            reason = str(call.get("error") or "") or str(call.get("result") or "")
            stats.last_error.offer(at, reason or "failed")

    def stage(self, key: str) -> StageStats:
        stats = self.stages.get(key)
        if stats is None:
            stats = self.stages[key] = StageStats()
        return stats

    # -- combining ----------------------------------------------------------------------------

    def merge(self, other: Aggregate) -> Aggregate:
        self.turns += other.turns
        self.errors += other.errors
        self.interrupted += other.interrupted
        self.apologies += other.apologies
        _add_counts(self.failures, other.failures)
        _add_counts(self.groups, other.groups)
        for stage, error in other.last_error.items():
            self.last_error.setdefault(stage, LastError()).offer(error.at, error.text)
        for key, stats in other.stages.items():
            self.stage(key).merge(stats)
        for name, tool in other.tools.items():
            self.tools.setdefault(name, ToolStats()).merge(tool)
        return self

    def merge_json(self, data: dict[str, Any], group: GroupKey | None = None) -> Aggregate:
        """Add one rollup row (to_json's shape) without building an Aggregate for it: the
        7-day figures add up hundreds of rows per page."""
        turns = int(data.get("turns", 0))
        self.turns += turns
        self.errors += int(data.get("errors", 0))
        self.interrupted += int(data.get("interrupted", 0))
        self.apologies += int(data.get("apologies", 0))
        _add_counts(self.failures, data.get("failures", {}))
        if group is not None:
            self.groups[group] = self.groups.get(group, 0) + turns
        for stage, error in data.get("last_error", {}).items():
            self.last_error.setdefault(stage, LastError()).offer_json(error)
        for key, stats in data.get("stages", {}).items():
            self.stage(key).merge_json(stats)
        for name, (calls, failed, error) in data.get("tools", {}).items():
            tool = self.tools.setdefault(name, ToolStats())
            tool.calls += int(calls)
            tool.failures += int(failed)
            tool.last_error.offer_json(error)
        return self

    @property
    def error_rate(self) -> float:
        return self.errors / self.turns if self.turns else 0.0

    # -- the rollup row's JSON (groups are the row's own key, so they are not stored) ------

    def to_json(self) -> dict[str, Any]:
        return {
            "turns": self.turns, "errors": self.errors, "interrupted": self.interrupted,
            "apologies": self.apologies, "failures": dict(self.failures),
            "last_error": {stage: error.to_json() for stage, error in self.last_error.items()},
            "stages": {key: stats.to_json() for key, stats in self.stages.items() if stats.count},
            "tools": {name: [tool.calls, tool.failures, tool.last_error.to_json()]
                      for name, tool in self.tools.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], group: GroupKey | None = None) -> Aggregate:
        return cls().merge_json(data, group)


def _add_counts(into: dict[Any, int], more: dict[Any, int]) -> None:
    for key, count in more.items():
        into[key] = into.get(key, 0) + int(count)

