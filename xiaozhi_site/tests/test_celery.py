"""A real Celery worker process runs a job: on the filesystem broker by default, on Redis in
the integration tier (REDIS_URL set)."""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from devices.models import Device
from testing.server import database_url

BASE_DIR = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def worker() -> Iterator[subprocess.Popen]:
    env = {**os.environ, "DATABASE_URL": database_url(connection.settings_dict)}
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "xiaozhi_site", "worker", "--pool=solo",
         "--without-mingle", "--without-gossip", "-l", "warning"],
        cwd=BASE_DIR, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    yield process
    process.terminate()
    process.wait(timeout=20)


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
