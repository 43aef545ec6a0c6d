"""What the dashboard counts about a set of turns, as one mergeable value (pure: no ORM).

`Aggregate` is filled from raw Turn rows (`add`) or from hourly rollups (`from_json`), and
aggregates of any hours or groups `merge` into the aggregate of their union: counters add,
histograms add bucket by bucket (histogram.py explains why that keeps percentiles correct),
the latest error wins. Exact values are kept while every part came from raw rows and there
are not too many of them, so short ranges get exact percentiles.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from dashboard import histogram

# Turn.timings keys the dashboard reads (ms after the end of the user's speech; gateway turns
# record llm_ms and total_ms from the text arriving, and llm_first_token if the gateway does).
TIMING_KEYS = ("asr_done", "llm_first_token", "tts_first_audio", "first_frame_sent", "last_frame_sent",
               "llm_ms", "total_ms")
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
    """The columns of one Turn the dashboard needs (see selectors.turn_rows)."""

    created_at: datetime
    source: str
    persona_id: int | None
    timings: Any
    providers: Any
    error: str
    interrupted: bool
    tool_calls: Any
    apology: bool

    @property
    def group(self) -> GroupKey:
        providers = self.providers if isinstance(self.providers, dict) else {}
        kinds = (str(providers.get(stage) or "")[:100] for stage in PROVIDER_STAGES)
        return GroupKey(self.source, self.persona_id, *kinds)


@dataclass
class StageStats:
    count: int = 0
    smallest: float | None = None
    largest: float | None = None
    buckets: Counter[int] = field(default_factory=Counter)
    values: list[float] | None = field(default_factory=list)  # None: not exact any more

    def add(self, ms: float) -> None:
        self.count += 1
        self.smallest = ms if self.smallest is None else min(self.smallest, ms)
        self.largest = ms if self.largest is None else max(self.largest, ms)
        self.buckets[histogram.bucket_of(ms)] += 1
        if self.values is not None:
            self.values.append(ms)
            if len(self.values) > EXACT_LIMIT:
                self.values = None

    def merge(self, other: StageStats) -> None:
        if other.count == 0:
            return
        self.count += other.count
        if other.smallest is not None:
            self.smallest = other.smallest if self.smallest is None else min(self.smallest, other.smallest)
        if other.largest is not None:
            self.largest = other.largest if self.largest is None else max(self.largest, other.largest)
        self.buckets.update(other.buckets)
        if self.values is None or other.values is None or len(self.values) + len(other.values) > EXACT_LIMIT:
            self.values = None
        else:
            self.values.extend(other.values)

    @property
    def exact(self) -> bool:
        return self.values is not None

    def percentile(self, percent: int) -> float | None:
        if self.count == 0:
            return None
        if self.values is not None:
            return histogram.percentile_exact(self.values, percent)
        return histogram.percentile_from_histogram(self.buckets, percent, smallest=self.smallest,
                                                   largest=self.largest)

    def to_json(self) -> dict[str, Any]:
        return {"n": self.count, "min": self.smallest, "max": self.largest,
                "h": {str(index): count for index, count in sorted(self.buckets.items())}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageStats:
        return cls(count=int(data["n"]), smallest=data.get("min"), largest=data.get("max"),
                   buckets=Counter({int(index): int(count) for index, count in data.get("h", {}).items()}),
                   values=None)


@dataclass
class LastError:
    at: datetime | None = None
    text: str = ""

    def offer(self, at: datetime | None, text: str) -> None:
        if text and at is not None and (self.at is None or at > self.at):
            self.at, self.text = at, text[:MAX_TEXT]

    def to_json(self) -> list[Any] | None:
        return [self.at.isoformat(), self.text] if self.at is not None else None

    @classmethod
    def from_json(cls, data: list[Any] | None) -> LastError:
        if not data:
            return cls()
        return cls(datetime.fromisoformat(data[0]), str(data[1]))


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
    failures: Counter[str] = field(default_factory=Counter)  # stage -> turns where all providers failed
    last_error: dict[str, LastError] = field(default_factory=dict)  # stage ("asr", "llm", "other")
    stages: dict[str, StageStats] = field(default_factory=dict)
    tools: dict[str, ToolStats] = field(default_factory=dict)
    groups: Counter[GroupKey] = field(default_factory=Counter)  # turns per (source, persona, providers)

    # -- filling ------------------------------------------------------------------------------

    def add(self, row: TurnRow) -> None:
        self.turns += 1
        self.interrupted += bool(row.interrupted)
        self.apologies += bool(row.apology)
        self.groups[row.group] += 1
        if row.error:
            self._add_error(row.created_at, row.error)
        timings = row.timings if isinstance(row.timings, dict) else {}
        for key in TIMING_KEYS:
            value = timings.get(key)
            if _is_number(value):
                self.stage(key).add(float(value))
        for call in row.tool_calls if isinstance(row.tool_calls, list) else ():
            if isinstance(call, dict):
                self._add_tool_call(row.created_at, call)

    def _add_error(self, at: datetime, error: str) -> None:
        self.errors += 1
        stage = error.split(":", 1)[0].strip() if ":" in error else ""
        stage = stage if stage in FAILED_STAGES else "other"
        if stage != "other":
            self.failures[stage] += 1
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
        return self.stages.setdefault(key, StageStats())

    # -- combining ----------------------------------------------------------------------------

    def merge(self, other: Aggregate) -> Aggregate:
        self.turns += other.turns
        self.errors += other.errors
        self.interrupted += other.interrupted
        self.apologies += other.apologies
        self.failures.update(other.failures)
        self.groups.update(other.groups)
        for stage, error in other.last_error.items():
            self.last_error.setdefault(stage, LastError()).offer(error.at, error.text)
        for key, stats in other.stages.items():
            self.stage(key).merge(stats)
        for name, tool in other.tools.items():
            self.tools.setdefault(name, ToolStats()).merge(tool)
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
        aggregate = cls(
            turns=int(data.get("turns", 0)), errors=int(data.get("errors", 0)),
            interrupted=int(data.get("interrupted", 0)), apologies=int(data.get("apologies", 0)),
            failures=Counter({stage: int(n) for stage, n in data.get("failures", {}).items()}),
            last_error={stage: LastError.from_json(error) for stage, error in data.get("last_error", {}).items()},
            stages={key: StageStats.from_json(stats) for key, stats in data.get("stages", {}).items()},
            tools={name: ToolStats(int(calls), int(failed), LastError.from_json(error))
                   for name, (calls, failed, error) in data.get("tools", {}).items()},
        )
        if group is not None:
            aggregate.groups[group] = aggregate.turns
        return aggregate


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
