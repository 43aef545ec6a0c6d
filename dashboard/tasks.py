from __future__ import annotations

from celery import shared_task


@shared_task
def turns_rollup() -> int:
    """Beat, every few minutes: roll finished hours of turns up for the dashboard."""
    from dashboard.services import turns_rollup as service

    return service()
