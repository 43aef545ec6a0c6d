"""Formatting and links for the dashboard templates, and the panel on the device admin page."""
from __future__ import annotations

from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django import template
from django.urls import reverse
from django.utils import timezone

from conversations.models import Turn
from dashboard import histogram
from dashboard.selectors import DEVICE_STAGES, STAGE_LABELS

register = template.Library()

DEVICE_PANEL_DAYS = 7
DEVICE_PANEL_TURNS = 10


def format_ms(value: float | None) -> str:
    """12.3 ms below 100 ms, 123 ms below 10 s, 12.3 s above; an em dash for no value."""
    if value is None:
        return "—"
    if value < 100:
        return f"{value:.1f} ms"
    if value < 10_000:
        return f"{value:.0f} ms"
    return f"{value / 1000:.1f} s"


@register.filter
def ms(value: float | None) -> str:
    return format_ms(value)


@register.filter
def pct(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 100:.1f} %"


@register.filter
def mapget(mapping: dict[str, Any], key: str) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


def _query(params: dict[str, Any]) -> str:
    kept = {key: value for key, value in params.items() if value not in (None, "", False)}
    return "?" + urlencode(kept) if kept else ""


@register.simple_tag
def turns_url(**params: Any) -> str:
    """The dashboard's turn list with these filters (see forms.TurnListQuery)."""
    if isinstance(params.get("min_ms"), float):
        params["min_ms"] = f"{params['min_ms']:.1f}"
    return reverse("dashboard:turns") + _query(params)


@register.simple_tag
def admin_list_url(model: str, **params: Any) -> str:
    """An admin changelist filtered with plain field lookups (allowed on any local field)."""
    app_label, model_name = model.split(".")
    return reverse(f"admin:{app_label}_{model_name}_changelist") + _query(params)


@register.simple_tag(takes_context=True)
def dashboard_url(context: template.Context, **params: Any) -> str:
    """The dashboard itself with the current query changed."""
    request = context["request"]
    merged = {key: request.GET.get(key) for key in ("range", "persona")} | params
    return reverse("dashboard:index") + _query(merged)


@register.inclusion_tag("dashboard/device_panel.html", takes_context=True)
def device_panel(context: template.Context, device: Any) -> dict[str, Any]:
    """Live online state, the device's own p50/p95 per stage over 7 days (exact, from its own
    turns) and its last turns, for the device's admin page."""
    request = context.get("request")
    since = timezone.now() - timedelta(days=DEVICE_PANEL_DAYS)
    turns = Turn.objects.filter(conversation__device=device, created_at__gte=since)
    values: dict[str, list[float]] = {key: [] for key in DEVICE_STAGES}
    for timings in turns.values_list("timings", flat=True).order_by().iterator(chunk_size=2000):
        for key in DEVICE_STAGES:
            value = timings.get(key) if isinstance(timings, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                values[key].append(float(value))
    stages = [{"key": key, "label": STAGE_LABELS[key], "n": len(values[key]),
               "p50": histogram.percentile_exact(values[key], 50), "p95": histogram.percentile_exact(values[key], 95)}
              for key in DEVICE_STAGES]
    can_read = bool(request and request.user.has_perm("conversations.view_turn"))
    last = list(Turn.objects.filter(conversation__device=device).select_related("conversation")
                .order_by("-created_at", "-pk")[:DEVICE_PANEL_TURNS]) if can_read else []
    return {"device": device, "stages": stages, "days": DEVICE_PANEL_DAYS, "last_turns": last,
            "can_read": can_read}
