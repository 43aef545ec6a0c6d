"""The hourly rollup (run by Celery beat): finished hours of turns → TurnRollup rows.

Each hour is rebuilt whole from its Turn rows inside one transaction (delete, insert), so a
re-run is harmless; `RollupState` says how far it has got, and the dashboard reads raw rows
from there on, so a rollup that lags (beat stopped, a long backfill) makes pages slower, never
wrong. An hour is rolled up once it is `SETTLE` old (a turn's row is written a moment after
it ends), and the last `REROLL_HOURS` are rebuilt on every run to take in stragglers.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from conversations.models import Turn
from dashboard.models import RollupState, TurnRollup
from dashboard.rows import HOUR, ROLLUP_NAME, floor_hour, turn_rows
from dashboard.stats import Aggregate, GroupKey

logger = logging.getLogger(__name__)

SETTLE = timedelta(minutes=1)
REROLL_HOURS = 2
BACKFILL = timedelta(days=8)  # the longest range shown is 7 days
MAX_HOURS_PER_RUN = 200  # a first run over a big history is split over a few beat ticks


def turns_rollup(*, now: datetime | None = None, max_hours: int = MAX_HOURS_PER_RUN) -> int:
    """Roll up every complete hour not rolled up yet (plus the last few again); returns how
    many hours were written."""
    now = now or timezone.now()
    target = floor_hour(now - SETTLE)  # hours before this one are complete
    hour = _first_hour(now, target)
    written = 0
    while hour < target and written < max_hours:
        turns_rollup_hour(hour)
        hour += HOUR
        written += 1
    if written:
        logger.info("turn rollup done", extra={"hours": written, "until": hour.isoformat()})
    return written


def _first_hour(now: datetime, target: datetime) -> datetime:
    state = RollupState.objects.filter(name=ROLLUP_NAME).first()
    if state is not None:
        return max(min(state.rolled_until, target) - REROLL_HOURS * HOUR, floor_hour(now - BACKFILL))
    oldest = Turn.objects.order_by("created_at").values_list("created_at", flat=True).first()
    if oldest is None:
        _advance(target)  # nothing to roll up: start from here
        return target
    return max(floor_hour(oldest), floor_hour(now - BACKFILL))


@transaction.atomic
def turns_rollup_hour(hour: datetime) -> int:
    """Rebuild the rollup rows of one hour; returns how many groups it had."""
    hour = floor_hour(hour)
    # The state row is the lock: two workers rolling up at once take turns, so an hour is
    # never deleted by one and inserted twice.
    RollupState.objects.get_or_create(name=ROLLUP_NAME, defaults={"rolled_until": hour})
    RollupState.objects.select_for_update().get(name=ROLLUP_NAME)
    groups: dict[GroupKey, Aggregate] = defaultdict(Aggregate)
    totals: dict[str, Aggregate] = defaultdict(Aggregate)
    for row in turn_rows(hour, hour + HOUR):
        groups[row.group].add(row)
    for key, aggregate in groups.items():
        totals[key.source].merge(aggregate)
    TurnRollup.objects.filter(hour=hour).delete()
    TurnRollup.objects.bulk_create([
        *(TurnRollup(hour=hour, source=key.source, persona_id=key.persona_id, asr=key.asr, llm=key.llm,
                     tts=key.tts, turns=aggregate.turns, data=aggregate.to_json())
          for key, aggregate in groups.items()),
        *(TurnRollup(hour=hour, source=source, is_total=True, turns=aggregate.turns, data=aggregate.to_json())
          for source, aggregate in totals.items()),
    ])
    _advance(hour + HOUR)
    return len(groups)


def _advance(until: datetime) -> None:
    state, created = RollupState.objects.get_or_create(name=ROLLUP_NAME, defaults={"rolled_until": until})
    if not created and state.rolled_until < until:
        state.rolled_until = until
        state.save(update_fields=["rolled_until", "updated_at"])
