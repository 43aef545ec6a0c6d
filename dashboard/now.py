"""The "Now" strip: what the dashboard polls every second."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.utils import timezone

from conversations.models import Turn
from dashboard.live import LiveSessions, live_sessions
from devices.models import Device


@dataclass
class NowFigures:
    devices_online: int
    turns_last_hour: int
    errors_last_hour: int
    sessions: LiveSessions
    since: datetime

    @property
    def error_rate(self) -> float:
        return self.errors_last_hour / self.turns_last_hour if self.turns_last_hour else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "devices_online": self.devices_online, "turns_last_hour": self.turns_last_hour,
            "errors_last_hour": self.errors_last_hour, "error_rate": round(self.error_rate, 4),
            "sessions_available": self.sessions.available, "sessions": self.sessions.sessions,
            "device_sockets": self.sessions.device_sockets, "gateway_clients": self.sessions.gateway,
            "processes": self.sessions.processes, "since": self.since.isoformat(),
        }


def now_figures(now: datetime | None = None) -> NowFigures:
    """Cheap enough to poll every second: two indexed counts and the published live counts."""
    now = now or timezone.now()
    since = now - timedelta(hours=1)
    turns = Turn.objects.filter(created_at__gte=since).aggregate(n=Count("pk"), errors=Count("pk", filter=~Q(error="")))
    return NowFigures(devices_online=Device.objects.filter(is_online=True).count(), turns_last_hour=turns["n"],
                      errors_last_hour=turns["errors"], sessions=live_sessions(), since=since)
