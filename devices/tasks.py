from __future__ import annotations

from celery import shared_task


@shared_task
def device_mark_stale_offline() -> int:
    from devices.presence import device_mark_stale_offline as service

    return service()
