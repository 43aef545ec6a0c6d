"""Reading turns and rollups: the only queries over the big tables, shared by the rollup task
and the dashboard's figures (so both count exactly the same way)."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone as dt_timezone

from django.db.models import BooleanField, Case, F, Q, QuerySet, Value, When

from conversations.models import Turn
from conversations.pipeline.reply import APOLOGIES
from dashboard.models import RollupState, TurnRollup
from dashboard.stats import Aggregate, GroupKey, TurnRow

HOUR = timedelta(hours=1)
ROLLUP_NAME = "turns"
_CHUNK = 2000


@dataclass(frozen=True)
class Scope:
    """Which turns a figure covers besides the time range (validated by forms.py)."""

    persona_id: int | None = None
    source: str | None = None


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(dt_timezone.utc).replace(minute=0, second=0, microsecond=0)


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
    """The columns the figures need, streamed in chunks. The apology test runs in the
    database so reply texts never leave it."""
    apology = Case(When(~Q(error="") & Q(reply_text__in=list(APOLOGIES.values())), then=Value(True)),
                   default=Value(False), output_field=BooleanField())
    rows = (
        turns_between(start, end, scope)
        .annotate(turn_source=F("conversation__source"), turn_persona=F("conversation__persona_id"),
                  turn_apology=apology)
        .values_list("created_at", "turn_source", "turn_persona", "timings", "providers", "error",
                     "interrupted", "tool_calls", "turn_apology")
        .order_by()
    )
    for values in rows.iterator(chunk_size=_CHUNK):
        yield TurnRow(*values)


def rolled_until() -> datetime | None:
    state = RollupState.objects.filter(name=ROLLUP_NAME).first()
    return state.rolled_until if state else None


def rollups_between(start: datetime, end: datetime,
                    scope: Scope = Scope()) -> Iterator[tuple[datetime, GroupKey, Aggregate]]:
    """(hour, group, aggregate) for each rollup row of the hours in [start, end)."""
    queryset = TurnRollup.objects.filter(hour__gte=start, hour__lt=end)
    if scope.persona_id is not None:
        queryset = queryset.filter(persona_id=scope.persona_id)
    if scope.source:
        queryset = queryset.filter(source=scope.source)
    fields = ("hour", "source", "persona_id", "asr", "llm", "tts", "data")
    for hour, source, persona_id, asr, llm, tts, data in queryset.values_list(*fields).order_by().iterator(_CHUNK):
        group = GroupKey(source, persona_id, asr, llm, tts)
        yield hour, group, Aggregate.from_json(data, group)
