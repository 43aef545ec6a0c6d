"""Hourly rollups of finished turns, so 24-hour and 7-day figures never read millions of rows."""
from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class TurnRollup(models.Model):
    """One hour of turns of one group (source, persona, providers used), as `stats.Aggregate`
    JSON: counters, per-stage latency histograms with fixed buckets (histogram.py), tool calls,
    last errors. Each hour also gets one `is_total` row per source (every group of that source
    added up, persona and providers blank), which is all the main dashboard page reads.
    Written only by `services.turns_rollup`; rebuilt whole per hour."""

    hour = models.DateTimeField(_("hour"), db_index=True, help_text=_("Start of the hour (UTC)."))
    source = models.CharField(_("source"), max_length=10)
    persona = models.ForeignKey(
        "conversations.Persona", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        verbose_name=_("persona"),
    )
    asr = models.CharField(_("ASR provider"), max_length=100, blank=True)
    llm = models.CharField(_("LLM provider"), max_length=100, blank=True)
    tts = models.CharField(_("TTS provider"), max_length=100, blank=True)
    is_total = models.BooleanField(_("all groups"), default=False)
    turns = models.PositiveIntegerField(_("turns"), default=0)
    data = models.JSONField(_("figures"), default=dict)

    class Meta:
        verbose_name = _("turn rollup")
        verbose_name_plural = _("turn rollups")
        ordering = ["hour"]
        indexes = [models.Index(fields=["is_total", "hour"], name="rollup_total_hour")]

    def __str__(self) -> str:
        return f"{self.hour:%Y-%m-%d %H}:00 {self.source} {self.turns}"


class RollupState(models.Model):
    """How far the rollup has got: every hour before `rolled_until` is in TurnRollup."""

    name = models.CharField(max_length=50, unique=True)
    rolled_until = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} until {self.rolled_until:%Y-%m-%d %H:%M}"
