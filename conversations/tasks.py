from __future__ import annotations

from celery import shared_task


@shared_task
def history_retention_apply() -> dict[str, int]:
    """Hourly (Celery beat): delete turn audio and conversations past their keep-time."""
    from dataclasses import asdict

    from conversations.retention import history_retention_apply as service

    return asdict(service())


@shared_task
def edge_voices_refresh() -> dict[str, object]:
    """Daily (Celery beat), and when the voice picker finds no list: Edge's voice list."""
    from conversations.voice_catalogue import edge_voices_refresh as service

    return service()
