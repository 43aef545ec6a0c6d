"""`make test` runs the suite in two pytest-xdist processes; each must use its own Redis
database (conftest.py), or one process's rate limits, channel groups and Celery queues would
reach the other's tests."""
from __future__ import annotations

import os
from urllib.parse import urlsplit

import pytest
import redis
from django.conf import settings
from django.core.cache import caches

def _db(url: str) -> int:
    return int(urlsplit(url).path.strip("/") or 0)


@pytest.mark.integration
def test_every_redis_user_of_this_process_shares_one_database(redis_url: str) -> None:
    from channels.layers import get_channel_layer

    from xiaozhi_site.celery import app

    expected = _db(redis_url)
    assert _db(os.environ["REDIS_URL"]) == expected  # what started servers and workers inherit
    assert _db(get_channel_layer().hosts[0]["address"]) == expected
    assert _db(app.conf.broker_url) == expected
    assert _db(app.conf.result_backend) == expected

    caches["default"].set("parallel-workers-probe", "here", 30)
    try:
        assert redis.Redis.from_url(redis_url).exists(":1:parallel-workers-probe")
    finally:
        caches["default"].delete("parallel-workers-probe")


def test_under_xdist_the_database_follows_the_worker_index(redis_url: str) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        pytest.skip("not under pytest-xdist (make test runs it with -n 2)")
    base = _db(redis_url) - 1 - int(worker.removeprefix("gw"))
    assert base >= 0, settings.REDIS_URL
