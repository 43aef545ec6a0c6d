"""Query-string validation for every dashboard page and data call: anything else is a 400."""
from __future__ import annotations

import re
from typing import Any

from django import forms
from django.utils.translation import gettext_lazy as _

from conversations.models import Conversation, Persona
from dashboard.rows import Scope
from dashboard.selectors import DEFAULT_RANGE, RANGE_LABELS, STAGE_LABELS, STAGE_PROVIDER
from dashboard.stats import FAILED_STAGES
from devices.models import Device

# stage:kind, or stage:kind,kind for the exact recorded list of a stage served by several
_PROVIDER = re.compile(r"(asr|llm|tts):([A-Za-z0-9_.-]{1,100}(?:,[A-Za-z0-9_.-]{1,100})*)")
MAX_PAGE = 1000
MAX_MS = 10_000_000.0


def _range_field() -> forms.ChoiceField:
    return forms.ChoiceField(label=_("Range"), choices=list(RANGE_LABELS.items()), required=False)


def _persona_field() -> forms.ModelChoiceField:
    return forms.ModelChoiceField(Persona.objects.all(), label=_("Persona"), required=False,
                                  empty_label=_("All personas"))


def _source_field() -> forms.ChoiceField:
    return forms.ChoiceField(label=_("Source"), choices=[("", _("All sources")), *Conversation.SOURCES],
                             required=False)


class _Query(forms.Form):
    """Blank fields take their defaults; unknown parameters are ignored."""

    def clean_range(self) -> str:
        return self.cleaned_data.get("range") or DEFAULT_RANGE

    @property
    def scope(self) -> Scope:
        persona = self.cleaned_data.get("persona")
        return Scope(persona_id=persona.pk if persona else None, source=self.cleaned_data.get("source") or None)

    def error_text(self) -> str:
        return "; ".join(f"{name}: {' '.join(str(e) for e in errors)}" for name, errors in self.errors.items())


class DashboardQuery(_Query):
    range = _range_field()
    persona = _persona_field()


class BreakdownQuery(_Query):
    range = _range_field()
    by = forms.ChoiceField(label=_("By"), choices=[("persona", _("persona")), ("provider", _("provider"))],
                           required=False)
    stage = forms.ChoiceField(label=_("Stage"), choices=[(key, STAGE_LABELS[key]) for key in STAGE_PROVIDER],
                              required=False)
    source = _source_field()
    persona = _persona_field()

    def clean_by(self) -> str:
        return self.cleaned_data.get("by") or "persona"

    def clean_stage(self) -> str:
        return self.cleaned_data.get("stage") or "first_frame_sent"


def _stage_kind(value: str) -> tuple[str, str] | None:
    if not value:
        return None
    match = _PROVIDER.fullmatch(value)
    if match is None:
        raise forms.ValidationError(_("Expected stage:kind, e.g. tts:edge."))
    return match.group(1), match.group(2)


class TurnListQuery(_Query):
    """The filters behind every figure's link (see turnlist.py)."""

    range = _range_field()
    source = _source_field()
    persona = _persona_field()
    device = forms.ModelChoiceField(Device.objects.all(), label=_("Device"), required=False)
    stage = forms.ChoiceField(label=_("Stage"), choices=[("", ""), *STAGE_LABELS.items()], required=False)
    min_ms = forms.FloatField(label=_("At least (ms)"), min_value=0.0, max_value=MAX_MS, required=False)
    # served by: "tts:edge", or the exact list "tts:edge,espeak"
    provider = forms.CharField(label=_("Served by"), max_length=104, required=False)
    fallback = forms.CharField(label=_("First choice replaced"), max_length=104, required=False)  # "tts:edge"
    failed = forms.ChoiceField(label=_("Failed"), choices=[("", ""), ("any", _("any")),
                                                           *((s, s) for s in (*FAILED_STAGES, "other"))],
                               required=False)
    interrupted = forms.BooleanField(label=_("Interrupted"), required=False)
    apology = forms.BooleanField(label=_("Ended in the apology"), required=False)
    tool = forms.CharField(label=_("Tool"), max_length=200, required=False)
    tool_failed = forms.BooleanField(label=_("Tool failed"), required=False)
    page = forms.IntegerField(label=_("Page"), min_value=1, max_value=MAX_PAGE, required=False)

    def clean_provider(self) -> tuple[str, str] | None:
        return _stage_kind(self.cleaned_data.get("provider") or "")

    def clean_fallback(self) -> tuple[str, str] | None:
        value = _stage_kind(self.cleaned_data.get("fallback") or "")
        if value is not None and "," in value[1]:
            raise forms.ValidationError(_("Name one provider."))
        return value

    def clean_page(self) -> int:
        return self.cleaned_data.get("page") or 1

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("min_ms") is not None and not data.get("stage"):
            self.add_error("min_ms", _("A minimum needs a stage."))
        if data.get("tool_failed") and not data.get("tool"):
            self.add_error("tool_failed", _("Name the tool."))
        return data
