"""`manage.py apply_retention`: what Celery beat runs hourly, by hand."""
from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from conversations.retention import history_retention_apply


class Command(BaseCommand):
    help = ("Delete turn audio older than XIAOZHI_AUDIO_RETENTION_DAYS and conversations older than "
            "XIAOZHI_CONVERSATION_RETENTION_DAYS (0 keeps them), as the hourly background job does.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--audio-days", type=int, help="Override XIAOZHI_AUDIO_RETENTION_DAYS (0 keeps).")
        parser.add_argument("--conversation-days", type=int,
                            help="Override XIAOZHI_CONVERSATION_RETENTION_DAYS (0 keeps).")

    def handle(self, *args: Any, **options: Any) -> None:
        for name in ("audio_days", "conversation_days"):
            if options[name] is not None and options[name] < 0:
                raise CommandError(f"--{name.replace('_', '-')} must be 0 or more")
        result = history_retention_apply(audio_days=options["audio_days"],
                                         conversation_days=options["conversation_days"])
        self.stdout.write(
            f"Removed the audio of {result.audio_turns} turn(s), {result.conversations} conversation(s) "
            f"with {result.turns} turn(s); {result.audio_files} audio file(s) deleted."
        )
