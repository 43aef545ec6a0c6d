"""List filters of the conversation review admin.

Each one is a single indexed query shape over the history tables (turn conditions are EXISTS
subqueries served by partial indexes), and none lists thousands of choices: devices are
chosen from the device page's link or found with the search box.
"""
from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.db.models import Count, Exists, IntegerField, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from conversations.models import Turn
from conversations.review import EMOTION_EMOJI
from devices.admin_actions import EMOTION_LABELS
from devices.models import Device


def count_turns(condition: Q | None = None) -> Coalesce:
    """Turns of the outer conversation matching `condition`, as a correlated subquery: the
    database evaluates it only for the rows on the page (an annotated Count would aggregate
    the whole join first)."""
    turns = Turn.objects.filter(conversation=OuterRef("pk"))
    if condition is not None:
        turns = turns.filter(condition)
    counted = turns.order_by().values("conversation").annotate(n=Count("pk")).values("n")
    return Coalesce(Subquery(counted, output_field=IntegerField()), Value(0))


def has_turns(condition: Q | None = None) -> Exists:
    turns = Turn.objects.filter(conversation=OuterRef("pk"))
    return Exists(turns.filter(condition) if condition is not None else turns)


HAS_ERROR = ~Q(error="")
INTERRUPTED = Q(interrupted=True)


class TurnsFilter(admin.SimpleListFilter):
    """Conversations nobody spoke in are noise: hidden unless asked for."""

    title = _("turns")
    parameter_name = "turns"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, Any]]:
        return [("empty", _("Without turns")), ("all", _("All"))]

    def choices(self, changelist: Any) -> Any:
        yield {"selected": self.value() is None, "display": _("With turns"),
               "query_string": changelist.get_query_string(remove=[self.parameter_name])}
        for lookup, title in self.lookup_choices:
            yield {"selected": self.value() == lookup, "display": title,
                   "query_string": changelist.get_query_string({self.parameter_name: lookup})}

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "all":
            return queryset
        if self.value() == "empty":
            return queryset.filter(~has_turns())
        return queryset.filter(has_turns())


class TurnConditionFilter(admin.SimpleListFilter):
    condition: Q

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, Any]]:
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "yes":
            return queryset.filter(has_turns(self.condition))
        if self.value() == "no":
            return queryset.filter(~has_turns(self.condition))
        return queryset


class HasErrorsFilter(TurnConditionFilter):
    title = _("has errors")
    parameter_name = "errors"
    condition = HAS_ERROR


class InterruptedFilter(TurnConditionFilter):
    title = _("interrupted")
    parameter_name = "interrupted"
    condition = INTERRUPTED


class _ForeignKeyFilter(admin.SimpleListFilter):
    field: str

    def has_output(self) -> bool:
        return True  # always shown, so a value given by a link can be seen and cleared

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(**{f"{self.field}_id": int(value)}) if value.isdigit() else queryset.none()


class DeviceFilter(_ForeignKeyFilter):
    """By device, without listing thousands of devices: the device page links here with
    `?device=<pk>`, and the search box finds devices by MAC or name."""

    title = _("device")
    parameter_name = "device"
    field = "device"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, Any]]:
        value = self.value()
        device = Device.objects.filter(pk=value).first() if value and value.isdigit() else None
        return [(str(device.pk), str(device))] if device else []


class OwnerFilter(_ForeignKeyFilter):
    """Owners of devices (the first 50 by name; beyond that, filter by device)."""

    title = _("owner")
    parameter_name = "owner"
    field = "device__owner"
    MAX_CHOICES = 50

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, Any]]:
        users = get_user_model().objects.filter(Exists(Device.objects.filter(owner=OuterRef("pk"))))
        return [(str(user.pk), str(user)) for user in users.order_by("username")[: self.MAX_CHOICES]]


class EmotionFilter(admin.SimpleListFilter):
    """The firmware's emotion names (a DISTINCT over every turn would scan the table)."""

    title = _("emotion")
    parameter_name = "emotion"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, Any]]:
        return [(emotion, f"{emoji} {EMOTION_LABELS.get(emotion, emotion)}")
                for emotion, emoji in sorted(EMOTION_EMOJI.items())]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        return queryset.filter(emotion=self.value()) if self.value() else queryset
