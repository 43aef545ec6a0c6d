"""Run once before the web process starts on a single machine (make run does)."""
from __future__ import annotations

from django.core.management.base import BaseCommand
from django.utils.translation import ngettext

from devices.presence import device_mark_all_offline


class Command(BaseCommand):
    help = "Mark devices left online by a crashed server as offline."

    def handle(self, *args: object, **options: object) -> None:
        count = device_mark_all_offline()
        if count:
            self.stdout.write(ngettext(
                "Marked %(count)d device left online by a previous run as offline.",
                "Marked %(count)d devices left online by a previous run as offline.", count,
            ) % {"count": count})
