from __future__ import annotations

from celery import shared_task


@shared_task
def history_retention_apply() -> dict[str, int]:
    """Hourly (Celery beat): delete turn audio and conversations past their keep-time."""
    from dataclasses import asdict

    from conversations.retention import history_retention_apply as service

    return asdict(service())
