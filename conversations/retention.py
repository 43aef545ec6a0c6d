"""History retention: turn audio and whole conversations past their keep-time are deleted.

Run hourly by Celery beat (`conversations.tasks.history_retention_apply`) and by hand with
`manage.py apply_retention`. Work goes in batches so a first run over a large history never
holds one long transaction or loads everything at once; files go through the storage API.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from conversations.models import HAS_AUDIO, Conversation, Turn
from conversations.recording import audio_files_delete

logger = logging.getLogger(__name__)

AUDIO_BATCH = 500
CONVERSATION_BATCH = 100  # each one takes its turns (and their files) along


@dataclass(frozen=True)
class RetentionResult:
    audio_turns: int = 0  # turns whose audio was removed (the turns stay)
    audio_files: int = 0  # files removed (with deleted conversations: by the turn delete signal)
    conversations: int = 0
    turns: int = 0  # turns deleted with their conversations


def history_retention_apply(
    *, now: datetime | None = None, audio_days: int | None = None, conversation_days: int | None = None,
) -> RetentionResult:
    """Apply XIAOZHI_AUDIO_RETENTION_DAYS and XIAOZHI_CONVERSATION_RETENTION_DAYS (0 keeps)."""
    now = now or timezone.now()
    audio_days = settings.XIAOZHI_AUDIO_RETENTION_DAYS if audio_days is None else audio_days
    conversation_days = (settings.XIAOZHI_CONVERSATION_RETENTION_DAYS
                         if conversation_days is None else conversation_days)
    conversations, turns, files_with_conversations = (
        _delete_conversations(now - timedelta(days=conversation_days)) if conversation_days > 0 else (0, 0, 0))
    audio_turns, audio_files = _delete_audio(now - timedelta(days=audio_days)) if audio_days > 0 else (0, 0)
    result = RetentionResult(audio_turns=audio_turns, audio_files=audio_files + files_with_conversations,
                             conversations=conversations, turns=turns)
    logger.info("history retention applied", extra={
        "audio_days": audio_days, "conversation_days": conversation_days,
        "audio_turns": result.audio_turns, "audio_files": result.audio_files,
        "conversations": result.conversations, "turns": result.turns,
    })
    return result


def _delete_audio(cutoff: datetime) -> tuple[int, int]:
    turns = files = 0
    old = Turn.objects.filter(HAS_AUDIO, created_at__lt=cutoff).order_by("created_at")
    while batch := list(old.values_list("pk", "user_audio", "reply_audio")[:AUDIO_BATCH]):
        with transaction.atomic():
            Turn.objects.filter(pk__in=[pk for pk, _, _ in batch]).update(
                user_audio="", reply_audio="", user_audio_ms=None, reply_audio_ms=None)
        # After the commit: a file outliving its row is harmless, a row outliving its file
        # is "audio unavailable".
        files += audio_files_delete(name for _, user, reply in batch for name in (user, reply))
        turns += len(batch)
    return turns, files


def _delete_conversations(cutoff: datetime) -> tuple[int, int, int]:
    conversations = turns = files = 0
    old = Conversation.objects.filter(started_at__lt=cutoff).order_by("started_at")
    while pks := list(old.values_list("pk", flat=True)[:CONVERSATION_BATCH]):
        names = Turn.objects.filter(HAS_AUDIO, conversation__in=pks).values_list("user_audio", "reply_audio")
        files += sum(1 for pair in names for name in pair if name)
        # Turn's post_delete receiver (conversations/recording.py) removes the files on commit.
        _, deleted = Conversation.objects.filter(pk__in=pks).delete()
        conversations += deleted.get("conversations.Conversation", 0)
        turns += deleted.get("conversations.Turn", 0)
    return conversations, turns, files
