"""The dashboard's pages and data calls: staff only, every query parameter validated.

Anonymous visitors are sent to the admin login (and back afterwards); signed-in users who are
not staff get 403. A query the forms reject gets 400 with the reason.
"""
from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib import admin
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext_lazy as _
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from dashboard.fleet import fleet_figures, fleet_json
from dashboard.forms import BreakdownQuery, DashboardQuery, TurnListQuery
from dashboard.now import now_figures
from dashboard.selectors import (
    RANGE_LABELS,
    STAGE_LABELS,
    STAGE_PROVIDER,
    breakdown,
    figures_json,
    latency_figures,
)
from dashboard.turnlist import turn_page
from devices.models import Device

View = Callable[..., HttpResponse]


def staff_required(view: View) -> View:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        if not user.is_authenticated:
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not (user.is_active and user.is_staff):
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return require_GET(never_cache(wrapped))


def _can_read_turns(request: HttpRequest) -> bool:
    """Error texts and transcripts need the same permission as the admin's turn list."""
    return request.user.has_perm("conversations.view_turn")


def _page(request: HttpRequest, template: str, title: Any, status: int = 200, **context: Any) -> TemplateResponse:
    context = {**admin.site.each_context(request), "title": title, **context}
    return TemplateResponse(request, template, context, status=status)


def _bad_query(request: HttpRequest, form: Any) -> HttpResponse:
    return _page(request, "dashboard/bad_query.html", _("Invalid dashboard query"), status=400, form=form)


@staff_required
def index(request: HttpRequest) -> HttpResponse:
    query = DashboardQuery(request.GET)
    if not query.is_valid():
        return _bad_query(request, query)
    now = timezone.now()
    figures = latency_figures(query.cleaned_data["range"], query.scope, now)
    chart_data = {"series": figures.series, "histogram": figures.histogram,
                  "labels": {"p50": "p50", "p95": "p95", "ms": "ms", "turns": str(_("turns"))}}
    return _page(request, "dashboard/index.html", _("Fleet dashboard"), query=query, figures=figures,
                 fleet=fleet_figures(now), now=now_figures(now), chart_data=chart_data,
                 ranges=list(RANGE_LABELS.items()), current_range=query.cleaned_data["range"],
                 range_label=RANGE_LABELS[query.cleaned_data["range"]], persona=query.cleaned_data.get("persona"),
                 can_read_turns=_can_read_turns(request))


@staff_required
def now_json(request: HttpRequest) -> HttpResponse:
    return JsonResponse(now_figures().to_json())


@staff_required
def figures_data(request: HttpRequest) -> HttpResponse:
    query = DashboardQuery(request.GET)
    if not query.is_valid():
        return JsonResponse({"error": "invalid_query", "fields": query.errors.get_json_data()}, status=400)
    now = timezone.now()
    body = figures_json(latency_figures(query.cleaned_data["range"], query.scope, now))
    body["fleet"] = fleet_json(fleet_figures(now))
    if not _can_read_turns(request):
        for row in (*body["failures"], *body["tools"]):
            row["last_error"] = ""
    return JsonResponse(body)


@staff_required
def breakdown_page(request: HttpRequest) -> HttpResponse:
    query = BreakdownQuery(request.GET)
    if not query.is_valid():
        return _bad_query(request, query)
    data = query.cleaned_data
    rows = breakdown(data["range"], data["by"], data["stage"], query.scope)
    return _page(request, "dashboard/breakdown.html", _("Latency breakdown"), query=query, rows=rows,
                 by=data["by"], stage=data["stage"], stage_label=STAGE_LABELS[data["stage"]],
                 provider_stage=STAGE_PROVIDER[data["stage"]],
                 current_range=data["range"], ranges=list(RANGE_LABELS.items()), stages=list(STAGE_LABELS.items()))


@staff_required
def turns(request: HttpRequest) -> HttpResponse:
    if not _can_read_turns(request):
        raise PermissionDenied
    query = TurnListQuery(request.GET)
    if not query.is_valid():
        return _bad_query(request, query)
    page = turn_page(query.cleaned_data, timezone.now())
    params = request.GET.copy()
    params.pop("page", None)
    return _page(request, "dashboard/turns.html", _("Turns"), query=query, page=page,
                 stage_label=STAGE_LABELS[page.stage], base_query=params.urlencode())


@staff_required
def device_live(request: HttpRequest, pk: int) -> HttpResponse:
    if not request.user.has_perm("devices.view_device"):
        raise PermissionDenied
    device = get_object_or_404(Device.objects.only("is_online", "online_since", "last_seen_at"), pk=pk)
    return JsonResponse({
        "online": device.is_online,
        "online_since": device.online_since.isoformat() if device.online_since else None,
        "last_seen_at": device.last_seen_at.isoformat() if device.last_seen_at else None,
    })
