"""The list behind every figure: turns of a range matching the figure's filters, newest first.

The admin's Turn list cannot filter on a number inside the timings JSON, so the dashboard has
its own list; every row links to the turn and its conversation in the admin. Pages are cut
with LIMIT/OFFSET without a total count: walking the Turn.created_at index from now backwards
stops after one page however many million rows match.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from conversations.models import Turn
from conversations.pipeline.phrases import PHRASES
from conversations.provider_configs import persona_first_kinds
from dashboard.expressions import JsonNumber
from dashboard.rows import Scope, turns_between
from dashboard.selectors import range_start
from dashboard.stats import FAILED_STAGES, PROVIDER_STAGES

PAGE_SIZE = 50
TOOL_SCAN_LIMIT = 5000  # rows read to fill one page when filtering on a tool (JSON lists)


@dataclass
class TurnPage:
    turns: Sequence[Turn]
    page: int
    has_next: bool
    stage: str
    scanned_out: bool = False  # a tool filter stopped after TOOL_SCAN_LIMIT rows


def turn_page(data: dict[str, Any], now: datetime) -> TurnPage:
    stage = data.get("stage") or "first_frame_sent"
    queryset = _filtered(data, now).annotate(stage_ms=JsonNumber("timings", stage))
    queryset = queryset.select_related("conversation__device", "conversation__persona").order_by(
        "-created_at", "-pk")
    page = data.get("page") or 1
    offset = (page - 1) * PAGE_SIZE
    if data.get("tool"):
        return _tool_page(queryset, data, page, offset, stage)
    turns = list(queryset[offset:offset + PAGE_SIZE + 1])
    return TurnPage(turns[:PAGE_SIZE], page, len(turns) > PAGE_SIZE, stage)


def _filtered(data: dict[str, Any], now: datetime) -> QuerySet[Turn]:
    persona = data.get("persona")
    scope = Scope(persona_id=persona.pk if persona else None, source=data.get("source") or None)
    queryset = turns_between(range_start(data["range"], now), None, scope)
    if data.get("device"):
        queryset = queryset.filter(conversation__device=data["device"])
    if data.get("stage"):
        queryset = queryset.filter(timings__has_key=data["stage"])
    if data.get("min_ms") is not None:
        queryset = queryset.alias(stage_value=JsonNumber("timings", data["stage"])).filter(
            stage_value__gte=data["min_ms"])
    if data.get("provider"):
        stage, kind = data["provider"]
        # The recorded value lists every kind that served the stage ("edge,espeak"): one kind
        # matches any list holding it, a list matches itself.
        if "," in kind:
            queryset = queryset.filter(**{f"providers__{stage}": kind})
        else:
            queryset = queryset.filter(**{f"providers__{stage}__regex": rf"(^|,){re.escape(kind)}(,|$)"})
    if data.get("fallback"):
        stage, kind = data["fallback"]
        queryset = queryset.filter(_fallback_q(stage, kind, scope))
    queryset = _failure_filters(queryset, data)
    if data.get("tool"):
        # A cheap text pre-filter; the exact match (name, success) is checked in Python.
        queryset = queryset.filter(tool_calls__icontains=f'"name": "{data["tool"]}"')
    return queryset


def _failure_filters(queryset: QuerySet[Turn], data: dict[str, Any]) -> QuerySet[Turn]:
    failed = data.get("failed")
    if failed or data.get("apology"):
        # Spelled out even where implied, so the partial index of turns with an error is used.
        queryset = queryset.exclude(error="")
    if failed in FAILED_STAGES:
        queryset = queryset.filter(error__startswith=f"{failed}:")
    elif failed == "other":
        for stage in FAILED_STAGES:
            queryset = queryset.exclude(error__startswith=f"{stage}:")
    if data.get("interrupted"):
        queryset = queryset.filter(interrupted=True)
    if data.get("apology"):
        queryset = queryset.filter(reply_text__in=list(PHRASES["apology"].values()))
    return queryset


def _fallback_q(stage: str, kind: str, scope: Scope) -> Q:
    """Device turns of personas naming `kind` first for the stage, served (in part) by another
    provider: the rule of the providers table (selectors._providers)."""
    assert stage in PROVIDER_STAGES
    firsts = persona_first_kinds(None if scope.persona_id is None else [scope.persona_id])
    chosen = [pk for pk, stages in firsts.items() if stages.get(stage) == kind]
    recorded = f"providers__{stage}"
    return (Q(conversation__source="device", conversation__persona_id__in=chosen, providers__has_key=stage)
            & ~Q(**{recorded: ""}) & ~Q(**{recorded: kind}))


def _tool_page(queryset: QuerySet[Turn], data: dict[str, Any], page: int, offset: int, stage: str) -> TurnPage:
    name, failed_only = data["tool"], bool(data.get("tool_failed"))
    matches: list[Turn] = []
    scanned = 0
    for turn in queryset.iterator(chunk_size=500):
        scanned += 1
        if _called(turn, name, failed_only):
            matches.append(turn)
            if len(matches) > offset + PAGE_SIZE:
                break
        if scanned >= TOOL_SCAN_LIMIT:
            break
    found = matches[offset:offset + PAGE_SIZE + 1]
    return TurnPage(found[:PAGE_SIZE], page, len(found) > PAGE_SIZE, stage,
                    scanned_out=scanned >= TOOL_SCAN_LIMIT)


def _called(turn: Turn, name: str, failed_only: bool) -> bool:
    calls = turn.tool_calls if isinstance(turn.tool_calls, list) else []
    return any(isinstance(c, dict) and c.get("name") == name and (not failed_only or not c.get("success"))
               for c in calls)

