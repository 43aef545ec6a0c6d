"""Presence services: online state and last-seen, without a DB write per audio frame.

A session calls `device_mark_online` once at hello, `device_touch` at most once a minute
(batched by the session), and `device_mark_offline` on disconnect. A crash leaves rows
online; `device_mark_all_offline` at start-up (single machine) and `device_mark_stale_offline`
from Celery beat (several machines) clean them up.
"""
from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from devices.models import Device

# A live session touches its row at least this often; rows older than 3x are stale.
TOUCH_INTERVAL_SECONDS = 60


def device_mark_online(*, device_id: int, session_id: str) -> None:
    now = timezone.now()
    Device.objects.filter(pk=device_id).update(
        is_online=True, online_since=now, last_seen_at=now, session_id=session_id
    )


def device_touch(*, device_id: int) -> None:
    Device.objects.filter(pk=device_id).update(last_seen_at=timezone.now())


def device_mark_offline(*, device_id: int, session_id: str) -> None:
    # Only the session that went online may take the device offline: a device that
    # reconnected quickly must not be marked offline by its previous socket closing late.
    Device.objects.filter(pk=device_id, session_id=session_id).update(
        is_online=False, last_seen_at=timezone.now()
    )


def device_mark_all_offline() -> int:
    return Device.objects.filter(is_online=True).update(is_online=False)


def device_mark_stale_offline() -> int:
    cutoff = timezone.now() - timedelta(seconds=3 * TOUCH_INTERVAL_SECONDS)
    return Device.objects.filter(is_online=True, last_seen_at__lt=cutoff).update(is_online=False)
