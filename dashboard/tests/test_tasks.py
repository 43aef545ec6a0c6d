"""The rollup as Celery runs it: on the beat schedule, and done by a real worker process."""
from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from dashboard.models import RollupState, TurnRollup
from dashboard.rows import floor_hour
from dashboard.tests.data import conversation, turn

BASE_DIR = Path(__file__).resolve().parents[2]


def test_beat_runs_the_rollup_every_five_minutes() -> None:
    from xiaozhi_site.celery import app

    entry = next(e for e in settings.CELERY_BEAT_SCHEDULE.values() if e["task"] == "dashboard.tasks.turns_rollup")
    assert entry["schedule"] == 300.0
    app.loader.import_default_modules()
    assert "dashboard.tasks.turns_rollup" in app.tasks


@pytest.fixture
def worker(celery_worker_factory: Any) -> subprocess.Popen:
    return celery_worker_factory()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_process_rolls_finished_hours_up(worker: subprocess.Popen) -> None:
    from dashboard.tasks import turns_rollup

    three_hours_ago = floor_hour(timezone.now()) - timedelta(hours=3)
    conv = conversation()
    turn(conv, at=three_hours_ago + timedelta(minutes=5), timings={"first_frame_sent": 300.0})
    turn(conv, at=three_hours_ago + timedelta(minutes=65), timings={"first_frame_sent": 500.0})
    assert turns_rollup.delay().get(timeout=60) >= 2  # and the empty hours up to the last finished one
    assert sorted(TurnRollup.objects.filter(is_total=False).values_list("hour", "turns")) == [
        (three_hours_ago, 1), (three_hours_ago + timedelta(hours=1), 1)]
    assert RollupState.objects.get().rolled_until >= three_hours_ago + timedelta(hours=2)
