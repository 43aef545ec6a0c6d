"""Reading turns and rollups: the only queries over the big tables, shared by the rollup task
and the dashboard's figures (so both count exactly the same way)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, UTC
from typing import Any

from django.db.models import BooleanField, Case, F, JSONField, Q, QuerySet, Sum, Value, When
from django.db.models.fields.json import KT

from conversations.models import Turn
from conversations.pipeline.phrases import PHRASES
from dashboard.models import RollupState, TurnRollup
from dashboard.expressions import JsonNumber
from dashboard.stats import PROVIDER_STAGES, TIMING_KEYS, GroupKey, TurnRow

HOUR = timedelta(hours=1)
ROLLUP_NAME = "turns"
_CHUNK = 10_000


@dataclass(frozen=True)
class Scope:
    """Which turns a figure covers besides the time range (validated by forms.py)."""

    persona_id: int | None = None
    source: str | None = None


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _scoped(queryset: QuerySet[Turn], scope: Scope) -> QuerySet[Turn]:
    if scope.persona_id is not None:
        queryset = queryset.filter(conversation__persona_id=scope.persona_id)
    if scope.source:
        queryset = queryset.filter(conversation__source=scope.source)
    return queryset


def turns_between(start: datetime, end: datetime | None, scope: Scope = Scope()) -> QuerySet[Turn]:
    """Turns created in [start, end) (end None: up to now), by the Turn.created_at index."""
    queryset = Turn.objects.filter(created_at__gte=start)
    if end is not None:
        queryset = queryset.filter(created_at__lt=end)
    return _scoped(queryset, scope)


def turn_rows(start: datetime, end: datetime | None, scope: Scope = Scope()) -> Iterator[TurnRow]:
    """The values the figures need, streamed in chunks. Timings and providers are picked out
    of their JSON in the database and the apology test runs there too, so neither whole JSON
    documents nor reply texts reach Python."""
    apology = Case(When(~Q(error="") & Q(reply_text__in=list(PHRASES["apology"].values())), then=Value(True)),
                   default=Value(False), output_field=BooleanField())
    timings = {f"t_{key}": JsonNumber("timings", key) for key in TIMING_KEYS}
    providers = {f"p_{stage}": KT(f"providers__{stage}") for stage in PROVIDER_STAGES}
    # Most turns call no tool: their "[]" is not even sent.
    tools = Case(When(tool_calls=[], then=Value(None)), default=F("tool_calls"), output_field=JSONField())
    rows = (
        turns_between(start, end, scope)
        .annotate(turn_source=F("conversation__source"), turn_persona=F("conversation__persona_id"),
                  turn_apology=apology, turn_tools=tools, **timings, **providers)
        .values_list("created_at", "turn_source", "turn_persona", "error", "interrupted", "turn_tools",
                     "turn_apology", *providers, *timings)
        .order_by()
    )
    split = 7 + len(PROVIDER_STAGES)
    for values in rows.iterator(chunk_size=_CHUNK):
        created_at, source, persona_id, error, interrupted, tools, apology = values[:7]
        yield TurnRow(created_at, source, persona_id, error, interrupted, tools, apology,
                      providers=tuple(str(p or "")[:100] for p in values[7:split]), timings=tuple(values[split:]))


def rollup_group_turns(start: datetime, end: datetime, scope: Scope = Scope()) -> dict[GroupKey, int]:
    """Turns per group over the rollup hours in [start, end), added up in the database."""
    queryset = TurnRollup.objects.filter(hour__gte=start, hour__lt=end, is_total=False)
    if scope.persona_id is not None:
        queryset = queryset.filter(persona_id=scope.persona_id)
    if scope.source:
        queryset = queryset.filter(source=scope.source)
    rows = queryset.values_list("source", "persona_id", "asr", "llm", "tts").annotate(n=Sum("turns")).order_by()
    return {GroupKey(source, persona_id, asr, llm, tts): n for source, persona_id, asr, llm, tts, n in rows}


def rolled_until() -> datetime | None:
    state = RollupState.objects.filter(name=ROLLUP_NAME).first()
    return state.rolled_until if state else None


def rollups_between(start: datetime, end: datetime, scope: Scope = Scope(), *,
                    totals: bool = False) -> Iterator[tuple[datetime, GroupKey, dict[str, Any]]]:
    """(hour, group, Aggregate JSON) for each rollup row of the hours in [start, end): the
    per-group rows, or with `totals` the one row per source and hour (no persona scope)."""
    if totals and scope.persona_id is not None:
        raise ValueError("total rows cannot be scoped to a persona")
    queryset = TurnRollup.objects.filter(hour__gte=start, hour__lt=end, is_total=totals)
    if scope.persona_id is not None:
        queryset = queryset.filter(persona_id=scope.persona_id)
    if scope.source:
        queryset = queryset.filter(source=scope.source)
    fields = ("hour", "source", "persona_id", "asr", "llm", "tts", "data")
    for hour, source, persona_id, asr, llm, tts, data in queryset.values_list(*fields).order_by().iterator(_CHUNK):
        yield hour, GroupKey(source, persona_id, asr, llm, tts), data
