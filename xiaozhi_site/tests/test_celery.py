"""A real Celery worker process runs a job: on the filesystem broker by default, on Redis in
the integration tier (REDIS_URL set)."""
from __future__ import annotations

import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from devices.models import Device

BASE_DIR = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def worker(celery_worker_factory: Any) -> subprocess.Popen:
    return celery_worker_factory()


def test_a_worker_process_runs_the_stale_presence_sweep(worker: subprocess.Popen) -> None:
    from devices.tasks import device_mark_stale_offline

    stale = Device.objects.create(mac="aa:bb:cc:00:00:01", is_online=True,
                                  last_seen_at=timezone.now() - timedelta(hours=1))
    fresh = Device.objects.create(mac="aa:bb:cc:00:00:02", is_online=True, last_seen_at=timezone.now())
    result = device_mark_stale_offline.delay()
    assert result.get(timeout=60) == 1
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert stale.is_online is False and fresh.is_online is True


@pytest.mark.integration
def test_the_integration_tier_runs_celery_on_redis() -> None:
    from xiaozhi_site.celery import app

    assert app.conf.broker_url.startswith("redis://")
    assert str(app.conf.result_backend).startswith("redis://")
