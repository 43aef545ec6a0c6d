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


def test_each_test_process_has_a_celery_folder_of_its_own() -> None:
    """Workers of two test processes polling one folder ran each other's jobs (conftest.py)."""
    import os

    from django.conf import settings

    if not settings.CELERY_BROKER_URL.startswith("filesystem://"):
        pytest.skip("the broker is not the filesystem")
    own = Path(os.environ["XIAOZHI_CELERY_DIR"])
    assert own == settings.CELERY_DIR and own != settings.DATA_DIR / "celery"
    folders = [Path(v) for k, v in settings.CELERY_BROKER_TRANSPORT_OPTIONS.items() if "folder" in k]
    assert len(folders) == 4 and all(f.is_relative_to(own) and f.is_dir() for f in folders)
    results = settings.CELERY_RESULT_BACKEND
    assert results == f"file://{own / 'results'}"
